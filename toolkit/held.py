"""Streamed text cut at tags: how much of a tail to hold back because it could still become a tag once more
text arrives. Shared by the stop strings (toolkit/serve/text.py), the reasoning and tool-call parsers
(toolkit/serve/) and harmony's channel split (toolkit/data/harmony.py); plain Python, so reading a reply's text
needs no torch."""
from __future__ import annotations


def held(text: str, tag: str) -> int:
    """How many trailing characters of `text` could be the start of `tag` (held back until more text shows)."""
    return max((k for k in range(1, len(tag)) if text.endswith(tag[:k])), default=0)
