"""Work split across processes: 'I/N' options (`bench --shard`, `regenerate --shard`, `dump-hidden-states --part`)."""
from __future__ import annotations


def parse_split(text: str, flag: str, example: str) -> tuple[int, int]:
    """'I/N' -> (I, N) with 0 <= I < N; otherwise a ValueError naming `flag` and showing `example`."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        i = n = -1
    if not 0 <= i < n:
        raise ValueError(f"{flag} {text!r}: give I/N with 0 <= I < N, e.g. {example}")
    return i, n
