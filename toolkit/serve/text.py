"""Generated tokens -> text deltas for streaming, cut at stop strings.

The whole generation is decoded each time (its text is then exactly the non-streamed text) and only the
new characters go out. Held back until more tokens arrive: a trailing U+FFFD (a multi-byte character split
across tokens) and a tail that could still become a stop string; the stop string itself never goes out.
"""
from __future__ import annotations


class TextStream:
    def __init__(self, tokenizer, stops: list[str]):
        self.tok, self.stops, self.sent = tokenizer, list(stops), 0
        self.stopped = False  # a stop string was found: the text ends before it

    def update(self, tokens: list[int], done: bool) -> str:
        """The text not sent yet for `tokens`; with done, everything that remains (minus a stop string)."""
        text = self.tok.decode(tokens, skip_special_tokens=True)
        hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if hits:
            text, self.stopped = text[:min(hits)], True
        elif not done:
            text = text.rstrip("\ufffd")
            hold = max((k for s in self.stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
            text = text[:len(text) - hold]
        delta = text[self.sent:] if len(text) > self.sent else ""
        self.sent = max(self.sent, len(text))
        return delta
