"""Generated tokens -> text deltas for streaming, cut at stop strings.

Decoded incrementally, as vLLM's detokenizer does: the tokens since the last read are decoded together with the
few before them (`prefix`..`read`) and only the characters that adds are kept, so the cost per update stays
constant however long the generation (decoding all of it each time made a 4,000-token stream cost 2.3 s of the
event loop's time) while the text stays that of decoding the whole generation at once (the window carries a
word's leading space and a multi-byte character's earlier bytes). Held back until more tokens arrive: a
trailing U+FFFD (a multi-byte character split across tokens) and a tail that could still become a stop string;
the stop string itself never goes out. With min_tokens m (vLLM's rule) a stop string counts only if it ends in
the text of a token after the m-th. Special tokens are left out of the text, except `keep`: the ones a tool-call
parser reads (`<tool_call>` is a special token in some tokenizers), as vLLM's parsers turn skip_special_tokens off.

`ClientStops` is the engine's stop-string check for a served request: it stops the sequence at the very token
at which the client's text (decoded without special tokens) shows a stop string, so the engine never generates
past a stop the response cuts at, and the usage it counts is that of the text returned.
"""
from __future__ import annotations

from toolkit.held import held
from toolkit.infer.sequence import StopStrings


def shown_ids(tok, tags) -> frozenset:
    """The ids of those of `tags` that are special tokens in `tok` (decoded text would drop them)."""
    special = {t.content: i for i, t in tok.added_tokens_decoder.items() if t.special}
    return frozenset(special[t] for t in tags if t in special)


class TextStream:
    def __init__(self, tokenizer, stops: list[str], min_tokens: int = 0, keep: frozenset = frozenset()):
        self.tok, self.stops, self.sent, self.min_tokens = tokenizer, list(stops), 0, min_tokens
        self.hidden = None  # with `keep`: the special ids still left out
        if keep:
            from toolkit.data.tokenizer import special_ids

            self.hidden = frozenset(special_ids(tokenizer)) - keep
        self.floor = 0 if min_tokens == 0 else None  # text[:floor] is the first m tokens': no stop may end there
        self.longest = max((len(s) for s in self.stops), default=0)
        self.text = ""                   # the decoded generation so far (up to `read` tokens)
        self.prefix = self.read = 0      # tokens[prefix:read]: the context the next tokens are decoded in
        self.stopped = False             # a stop string was found: the text ends before it
        self.stop_at: int | None = None  # then: the tokens up to the one that completed it (the engine's count)
        self.matched: str | None = None  # and which stop string it was

    def _decode(self, tokens: list[int]) -> str:
        if self.hidden is None:
            return self.tok.decode(tokens, skip_special_tokens=True)
        return self.tok.decode([t for t in tokens if t not in self.hidden], skip_special_tokens=False)

    def _hit(self, text: str, start: int) -> int | None:
        """Where the first stop string in text[start:] that ends past `floor` begins, if any."""
        return min((i for i in (text.find(s, max(start, self.floor - len(s) + 1)) for s in self.stops) if i >= 0),
                   default=None)

    def scan(self, tokens: list[int], done: bool = False) -> str:
        """Take in `tokens` (the whole generation so far) and return the text, cut before a stop string if one
        shows (then `stopped` and `stop_at` are set). Nothing is held back here: `update` does that."""
        if self.stopped:
            return self.text
        searched = max(len(self.text) - self.longest + 1, 0)  # a stop may straddle the old end of the text
        kept, prefix, read = self.text, self.prefix, self.read
        if len(tokens) > read:
            before = self._decode(tokens[prefix:read])
            after = self._decode(tokens[prefix:])
            # a new character completed (or the last update): keep it and move the window on
            if len(after) > len(before) and (done or not after.endswith("\ufffd")):
                self.text += after[len(before):]
                self.prefix, self.read = read, len(tokens)
        if self.floor is None and len(tokens) > self.min_tokens:
            self.floor = len(self._decode(tokens[:self.min_tokens]))
        hit = None if self.floor is None else self._hit(self.text, searched)
        if hit is None:
            return self.text
        self.matched = next(s for s in self.stops if self.text.find(s, max(searched, self.floor - len(s) + 1)) == hit)
        self.stopped, self.text = True, self.text[:hit]
        self.stop_at = self._completing(tokens[prefix:self.read], read - prefix, kept, searched) + prefix
        return self.text

    def _completing(self, window: list[int], read: int, kept: str, searched: int) -> int:
        """How many of `window`'s tokens the text needs to show the stop string: through the one that completed
        it, where the engine would have stopped on its own. The text for window[:read] held none, so it is one
        of the new ones; a binary search, as one update may bring a whole generation (a non-streamed reply)."""
        before = self._decode(window[:read])
        lo, hi = read + 1, len(window)
        while lo < hi:
            mid = (lo + hi) // 2
            if self._hit(kept + self._decode(window[:mid])[len(before):], searched) is None:
                lo = mid + 1
            else:
                hi = mid
        return hi

    def update(self, tokens: list[int], done: bool) -> str:
        """The text not sent yet for `tokens` (the whole generation so far); with done, everything that remains
        (minus a stop string)."""
        if self.stopped:
            return ""
        text = self.scan(tokens, done)
        if not (self.stopped or done):
            text = text.rstrip("\ufffd")
            hold = max((held(text, s) for s in self.stops), default=0)
            text = text[:len(text) - hold]
        delta = text[self.sent:] if len(text) > self.sent else ""
        self.sent = max(self.sent, len(text))
        return delta


class ClientStops(StopStrings):
    """A served request's stop strings as the engine checks them after each token: found in the text the client
    gets (special tokens skipped, as TextStream decodes it) or, as StopStrings finds them, in the text with
    special tokens (a stop string that is one). The first alone missed a stop string that a special token in the
    generation splits: the response cut the text there while the engine generated on to max_tokens, and the
    usage it reported counted those tokens too."""

    def __init__(self, tokenizer, strings: list[str], min_tokens: int = 0, keep: frozenset = frozenset()):
        super().__init__(tokenizer, strings)
        self.client = TextStream(tokenizer, strings, min_tokens, keep)

    def __call__(self, tokens: list[int], min_tokens: int = 0) -> bool:
        self.client.scan(tokens)
        return self.client.stopped or super().__call__(tokens, min_tokens)
