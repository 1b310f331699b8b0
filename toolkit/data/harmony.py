"""OpenAI's harmony chat format (gpt-oss): a reply is messages

    [<|start|>assistant]<|channel|>NAME[ to=RECIPIENT][<|constrain|>...]<|message|>BODY<|end|>

the last one ended by <|return|> (the turn's end) or <|call|> (a tool call); channel analysis is the model's
reasoning, final the answer, commentary preambles and tool calls. The tags are special tokens: a decode that
drops special tokens runs the headers into the text ("analysisUser asks...assistantfinal4."), so the reply is read
with them kept. Used by `serve --reasoning-parser gpt_oss` (toolkit/serve/reasoning.py) and for the answer text
of bench's multi-turn prompts (reply_text) and in-process regeneration (reply_parts: the analysis kept apart).
"""
from __future__ import annotations

from toolkit.held import held

CHANNEL, MESSAGE, ENDS = "<|channel|>", "<|message|>", ("<|end|>", "<|call|>", "<|return|>")
HARMONY_TAGS = ("<|start|>", CHANNEL, MESSAGE, "<|constrain|>", "<|end|>")  # what a reply's text must keep


def is_harmony(tok) -> bool:
    """Whether `tok` writes the harmony format (its vocabulary has <|channel|> and <|return|>)."""
    vocab = tok.get_vocab()
    return CHANNEL in vocab and "<|return|>" in vocab


def reply_text(tok, tokens: list[int]) -> str:
    """A generated turn's text as a chat template takes a past assistant turn (the analysis is not re-read)."""
    return reply_parts(tok, tokens)[1]


def reply_parts(tok, tokens: list[int]) -> tuple[str, str]:
    """A generated turn as (reasoning, text), special tokens left out: from a harmony tokenizer the analysis
    channel's bodies and the final (and commentary) channels' text; from any other ("", all of it)."""
    if not is_harmony(tok):
        return "", tok.decode(tokens, skip_special_tokens=True)
    from toolkit.data.chat import special_ids

    keep = {tok.convert_tokens_to_ids(t) for t in HARMONY_TAGS}
    hidden = frozenset(special_ids(tok)) - keep
    text = tok.decode([t for t in tokens if t not in hidden], skip_special_tokens=False)
    return HarmonySplit().feed(text, done=True)


class HarmonySplit:
    """gpt-oss's harmony messages: analysis bodies -> reasoning, the other channels' -> content, headers dropped."""

    def __init__(self):
        self.phase = "header"  # header (up to <|message|>) or body (up to an end tag)
        self.channel = "final"
        self.pending = ""

    def feed(self, text: str, done: bool = False) -> tuple[str, str]:
        self.pending += text
        parts = {"reasoning": "", "content": ""}
        while self.pending:
            if self.phase == "header":
                head = self.pending.lstrip()
                if head and not head.startswith("<|") and not "<|".startswith(head):  # no header: plain content
                    self.phase, self.channel = "body", "final"
                    continue
                at = self.pending.find(MESSAGE)
                if at < 0:
                    if done:
                        self.pending = ""  # a header cut off by max_tokens: nothing of the answer
                    break
                header = self.pending[:at]
                named = header.rsplit(CHANNEL, 1)[1].split() if CHANNEL in header else []
                self.channel = named[0].split("<|")[0] if named else "final"
                self.pending, self.phase = self.pending[at + len(MESSAGE):], "body"
                continue
            ends = [(i, tag) for tag in ENDS if (i := self.pending.find(tag)) >= 0]
            cut, tag = min(ends) if ends else (len(self.pending), "")
            if not ends and not done:  # a tail that may still become an end tag waits
                cut -= max(held(self.pending, t) for t in ENDS)
            parts["reasoning" if self.channel == "analysis" else "content"] += self.pending[:cut]
            self.pending = self.pending[cut + len(tag):]
            if not tag:
                break
            self.phase = "header"
        return parts["reasoning"], parts["content"]
