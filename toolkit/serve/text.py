"""Generated tokens -> text deltas for streaming, cut at stop strings.

Decoded incrementally, as vLLM's detokenizer does: the tokens since the last read are decoded together with the
few before them (`prefix`..`read`) and only the characters that adds are kept, so the cost per update stays
constant however long the generation (decoding all of it each time made a 4,000-token stream cost 2.3 s of the
event loop's time) while the text stays that of decoding the whole generation at once (the window carries a
word's leading space and a multi-byte character's earlier bytes). Held back until more tokens arrive: a
trailing U+FFFD (a multi-byte character split across tokens) and a tail that could still become a stop string;
the stop string itself never goes out.
"""
from __future__ import annotations


class TextStream:
    def __init__(self, tokenizer, stops: list[str]):
        self.tok, self.stops, self.sent = tokenizer, list(stops), 0
        self.longest = max((len(s) for s in self.stops), default=0)
        self.text = ""                   # the decoded generation so far (up to `read` tokens)
        self.prefix = self.read = 0      # tokens[prefix:read]: the context the next tokens are decoded in
        self.stopped = False             # a stop string was found: the text ends before it

    def _decode(self, tokens: list[int]) -> str:
        return self.tok.decode(tokens, skip_special_tokens=True)

    def update(self, tokens: list[int], done: bool) -> str:
        """The text not sent yet for `tokens` (the whole generation so far); with done, everything that remains
        (minus a stop string)."""
        if self.stopped:
            return ""
        searched = max(len(self.text) - self.longest + 1, 0)  # a stop may straddle the old end of the text
        if len(tokens) > self.read:
            before = self._decode(tokens[self.prefix:self.read])
            after = self._decode(tokens[self.prefix:])
            # a new character completed (or the last update): keep it and move the window on
            if len(after) > len(before) and (done or not after.endswith("\ufffd")):
                self.text += after[len(before):]
                self.prefix, self.read = self.read, len(tokens)
        text = self.text
        hits = [i for i in (text.find(s, searched) for s in self.stops) if i >= 0]
        if hits:
            text, self.stopped = text[:min(hits)], True
        elif not done:
            text = text.rstrip("\ufffd")
            hold = max((k for s in self.stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
            text = text[:len(text) - hold]
        delta = text[self.sent:] if len(text) > self.sent else ""
        self.sent = max(self.sent, len(text))
        return delta
