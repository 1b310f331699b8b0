"""A reasoning model's thinking split from its answer in chat replies (vLLM's and SGLang's `--reasoning-parser`):
the message's `reasoning_content` (DeepSeek's and SGLang's name; `reasoning` too, vLLM's newer one) holds the text
between `<think>` and `</think>`, `content` what follows. Streamed, each delta carries the part it belongs to; a
tail that could still become a tag is held back until the next text or the end.

  qwen3        Qwen3 (and Qwen3.5 hybrids): thinking only when the reply opens with `<think>`; a reply without it
               (`enable_thinking: false` puts an empty think block in the prompt) is all content.
  deepseek_r1  DeepSeek-R1, QwQ, Qwen3-Thinking-2507: their templates open the think block in the prompt, so the
               reply is thinking (a leading `<think>` dropped) until `</think>`, all of it if that never comes.
"""
from __future__ import annotations

from toolkit.serve.text import held

START, END = "<think>", "</think>"
PARSERS = ("qwen3", "deepseek_r1")


class ReasoningSplit:
    def __init__(self, parser: str):
        if parser not in PARSERS:
            raise ValueError(f"reasoning parser {parser!r}: accepted {', '.join(PARSERS)}")
        self.parser = parser
        self.phase = "open"  # open (the reply's first characters decide), think, answer
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
