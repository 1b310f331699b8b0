"""Exact token counts for byte-level BPE tokenizers without tokenizing every occurrence of every word.

A byte-level BPE tokenizer (GPT-2, Llama-3, Qwen2, SmolLM2 families) cuts text in three independent stages:
added tokens (<|eot_id|>, ...) are split out first, the rest is cut into pieces by one regex, and BPE then
encodes each piece on its own. So the count of token t over a corpus is
    sum over distinct pieces p of  count(p) * (occurrences of t in BPE(p))
and BPE needs to run once per distinct piece (~40k for 3M tokens) instead of once per piece occurrence.
Measured here, Python's `regex` cuts pieces 2.4x faster than the tokenizer's Oniguruma pre-tokenizer, which
is most of the cost of tokenizing. Only exact layouts are accepted (`PieceCounter.build` returns None
otherwise), and count.py checks the first batch against real tokenization before trusting it.
"""
from __future__ import annotations

import json
import unicodedata
from collections import Counter
from functools import lru_cache

import numpy as np
import regex

# tokenizers' ByteLevel pre-tokenizer pattern (use_regex=True), the GPT-2 one
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


@lru_cache(maxsize=1)
def _byte_chars() -> list[str]:
    """GPT-2's bytes -> printable unicode table (what ByteLevel maps each byte to before BPE)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


class PieceSplitter:
    """Cuts texts into added tokens and regex pieces and counts both. Small and picklable: it is what
    worker processes receive."""

    def __init__(self, pattern: str, normalizer: str | None, added: list[str]):
        self.pattern = regex.compile(pattern)
        self.normalizer = normalizer
        alternatives = "|".join(regex.escape(c) for c in sorted(added, key=len, reverse=True))
        self.added_re = regex.compile(f"({alternatives})") if added else None

    def count_pieces(self, texts: list[str]) -> tuple[Counter, Counter]:
        """(piece counts, added-token counts by content) over texts; picklable, so it runs in processes."""
        found, specials = [], []
        for text in texts:
            parts = self.added_re.split(text) if self.added_re is not None else [text]
            specials.extend(parts[1::2])  # split() with a capturing group interleaves the separators
            for seg in parts[::2]:
                if not seg:
                    continue
                if self.normalizer:
                    seg = unicodedata.normalize(self.normalizer, seg)
                pieces = self.pattern.findall(seg)
                if sum(map(len, pieces)) != len(seg):  # "Isolated": gaps between matches are pieces too
                    pieces = self._with_gaps(seg)
                found.extend(pieces)
        return Counter(found), Counter(specials)

    def __getstate__(self):  # compiled patterns travel as their sources
        return {"pattern": self.pattern.pattern, "normalizer": self.normalizer,
                "added_re": self.added_re.pattern if self.added_re is not None else None}

    def __setstate__(self, state):
        self.pattern, self.normalizer = regex.compile(state["pattern"]), state["normalizer"]
        self.added_re = regex.compile(state["added_re"]) if state["added_re"] is not None else None

    def _with_gaps(self, seg: str) -> list[str]:
        out, pos = [], 0
        for m in self.pattern.finditer(seg):
            if m.start() > pos:
                out.append(seg[pos:m.start()])
            out.append(m.group())
            pos = m.end()
        if pos < len(seg):
            out.append(seg[pos:])
        return out


class PieceCounter:
    """A splitter plus the tokenizer's own BPE model, which maps each distinct piece to its token ids."""

    def __init__(self, backend, pattern: str, normalizer: str | None):
        self.model = backend.model  # a `tokenizers.Tokenizer`'s BPE model
        self.added = {t.content: i for i, t in backend.get_added_tokens_decoder().items()}
        self.splitter = PieceSplitter(pattern, normalizer, list(self.added))
        self.cache: dict[str, list[int]] = {}  # piece -> token ids

    @classmethod
    def build(cls, backend) -> "PieceCounter | None":
        """A counter for this `tokenizers.Tokenizer` (or its JSON text), or None when its pipeline is not
        one we reproduce exactly."""
        from tokenizers import Tokenizer

        backend = Tokenizer.from_str(backend) if isinstance(backend, str) else backend
        state = lambda part: json.loads(part.__getstate__()) if part is not None else None  # noqa: E731
        norm = state(backend.normalizer)
        if norm is not None and norm.get("type") != "NFC":
            return None
        # post-processors do not matter (add_special_tokens=False); BPE dropout would make counts random
        if type(backend.model).__name__ != "BPE" or backend.model.dropout:
            return None
        for t in backend.get_added_tokens_decoder().values():
            if t.lstrip or t.rstrip or t.single_word or (t.normalized and norm is not None):
                return None
        pre = state(backend.pre_tokenizer) or {}
        steps = pre["pretokenizers"] if pre.get("type") == "Sequence" else [pre]
        if len(steps) == 1 and steps[0].get("type") == "ByteLevel" and steps[0].get("use_regex") \
                and not steps[0].get("add_prefix_space"):
            pattern = GPT2_PATTERN
        elif len(steps) == 2 and steps[0].get("type") == "Split" and steps[0].get("behavior") == "Isolated" \
                and not steps[0].get("invert") and "Regex" in steps[0].get("pattern", {}) \
                and steps[1].get("type") == "ByteLevel" and not steps[1].get("use_regex") \
                and not steps[1].get("add_prefix_space"):
            pattern = steps[0]["pattern"]["Regex"]
        else:
            return None
        return cls(backend, pattern, norm["type"] if norm else None)

    def token_counts(self, pieces: Counter, added: Counter, vocab_size: int) -> np.ndarray:
        """Token counts int64[vocab_size] from piece and added-token counts (BPE once per new piece)."""
        chars, cache = _byte_chars(), self.cache
        if len(cache) > 2_000_000:  # keep memory bounded on huge, diverse corpora
            cache.clear()
        ids, weights = [], []
        for piece, n in pieces.items():
            toks = cache.get(piece)
            if toks is None:
                mapped = "".join(chars[b] for b in piece.encode("utf-8"))  # ByteLevel's byte -> char map
                toks = cache[piece] = [t.id for t in self.model.tokenize(mapped)]
            ids.extend(toks)
            weights.extend([n] * len(toks))
        for content, n in added.items():
            ids.append(self.added[content])
            weights.append(n)
        counts = np.bincount(np.asarray(ids, dtype=np.int64), weights=np.asarray(weights, dtype=np.float64),
                             minlength=vocab_size)
        return np.rint(counts).astype(np.int64)
