"""A reasoning model's thinking split from its answer in chat replies (vLLM's and SGLang's `--reasoning-parser`):
the message's `reasoning_content` (DeepSeek's and SGLang's name; `reasoning` too, vLLM's newer one) holds the text
between `<think>` and `</think>`, `content` what follows. Streamed, each delta carries the part it belongs to; a
tail that could still become a tag is held back until the next text or the end.

  qwen3        Qwen3 (and Qwen3.5 hybrids): thinking only when the reply opens with `<think>`; a reply without it
               (`enable_thinking: false` puts an empty think block in the prompt) is all content.
  deepseek_r1  DeepSeek-R1, QwQ, Qwen3-Thinking-2507: their templates open the think block in the prompt, so the
               reply is thinking (a leading `<think>` dropped) until `</think>`, all of it if that never comes.
  gpt_oss      gpt-oss's harmony format (vLLM's and SGLang's `gpt-oss`): the reply is messages
               `[<|start|>assistant]<|channel|>NAME[ to=...][<|constrain|>...]<|message|>BODY<|end|>`, the last
               ended by <|return|> or <|call|> (stop tokens); the analysis channel's bodies are the thinking, the
               others' (final, commentary) the content, and the headers go. A reply with no header is all content.
               Its tags are special tokens: the text it reads keeps them (TAGS), the client's does not.
               Messages addressed `to=functions.NAME` are tool calls with `--tool-call-parser openai` (their
               bodies the arguments), else their JSON is content.
"""
from __future__ import annotations

from toolkit.data.harmony import HARMONY_TAGS, HarmonySplit
from toolkit.held import held

START, END = "<think>", "</think>"
PARSERS = ("qwen3", "deepseek_r1", "gpt_oss")
TAGS = {"gpt_oss": HARMONY_TAGS}  # special tokens the parser reads: kept in its text


def reasoning_split(parser: str, calls: bool = False, closed: bool = False):
    """The splitter of --reasoning-parser `parser`: feed(text, done) -> (reasoning, content) deltas; gpt_oss with
    `calls` also reads harmony's tool calls (HarmonySplit.take_calls). closed: the reply starts past any thinking
    (reply_closed), so it is all content."""
    return HarmonySplit(calls) if parser == "gpt_oss" else ReasoningSplit(parser, closed)


def reply_closed(tok, seq) -> bool:
    """Whether a chat reply starts past thinking: its prompt has closed the think block (Qwen3's enable_thinking
    false writes an empty one), or a grammar constrains it from its first token (a forced tool call's arguments,
    a response format, where `</think>` is no token to wait for). deepseek_r1 read such a reply, which never
    writes `</think>`, as all thinking: a named tool's arguments came back as reasoning and the call empty."""
    from toolkit.infer.grammar import after_thinking

    if seq.grammar is not None:
        return seq.grammar.from_start  # read on the event loop: the engine thread may have moved `active` on
    end, closed = after_thinking(tok, seq.prompt)
    return end is not None and closed


def reasoning_tokens(tok, parser: str, tokens: list[int], closed: bool) -> int:
    """The reply's tokens inside its think block, the tags left out (vLLM's count_reasoning_tokens; OpenAI's
    reasoning_tokens): deepseek_r1's reply starts inside (its prompt opened the block) unless `closed`. 0 where the
    tags are no single tokens, and for gpt_oss (its analysis channel is not counted)."""
    start, end = (tok.convert_tokens_to_ids(t) for t in (START, END))
    if parser == "gpt_oss" or tok.convert_ids_to_tokens(end) != END or tok.convert_ids_to_tokens(start) != START:
        return 0
    inside, count = parser == "deepseek_r1" and not closed, 0
    for i, t in enumerate(tokens):
        if t == start and i == 0 and not closed:  # a reply that opens its block (qwen3's only way to think)
            inside = True
        elif t == end and inside:  # the rest is the answer
            break
        else:
            count += inside
    return count


class ReasoningSplit:
    def __init__(self, parser: str, closed: bool = False):
        if parser not in PARSERS:
            raise ValueError(f"reasoning parser {parser!r}: accepted {', '.join(PARSERS)}")
        self.parser = parser
        self.phase = "answer" if closed else "open"  # open (the reply's first characters decide), think, answer
        self.pending = ""    # text not yet assigned to a part

    def feed(self, text: str, done: bool = False) -> tuple[str, str]:
        """The next piece of the reply -> (reasoning, content) deltas; done: the reply is whole, flush all."""
        self.pending += text
        reasoning = content = ""
        if self.phase == "open":
            stripped = self.pending.lstrip()
            if START.startswith(stripped) and stripped != START and not done:
                return "", ""  # it may still become <think>: wait
            opened = stripped.startswith(START)
            if opened:
                self.pending = stripped[len(START):]
            self.phase = "think" if opened or self.parser == "deepseek_r1" else "answer"
        if self.phase == "think":
            end = self.pending.find(END)
            if end < 0:
                keep = 0 if done else held(self.pending, END)
                cut = len(self.pending) - keep
                reasoning, self.pending = self.pending[:cut], self.pending[cut:]
                return reasoning, ""
            reasoning, self.pending, self.phase = self.pending[:end], self.pending[end + len(END):], "answer"
        content, self.pending = self.pending, ""
        return reasoning, content
