"""Acceptance and speed metrics over engine results (per request and per run).

tau        tokens emitted per verify step, the bonus token included: mean(accepted + 1)
accept[k]  share of verify steps that accepted at least k draft tokens (k = 1..max depth)
histogram  count of verify steps by accepted length 0, 1, 2, ...
"""
from __future__ import annotations

from collections import Counter

from toolkit.infer.sequence import Result


def summarize(results: list[Result], seconds: float | None = None) -> dict:
    accepted = [a for r in results for a in r.accepted]
    steps = len(accepted)
    hist = Counter(accepted)
    depth = max(accepted, default=0)
    tokens = sum(len(r.tokens) for r in results)
    split = {k: sum(r.seconds[k] for r in results) for k in ("prefill", "draft", "verify")}
    wall = seconds if seconds is not None else sum(split.values())
    split["other"] = max(wall - sum(split.values()), 0.0)
    return {
        "requests": len(results), "tokens": tokens, "verify_steps": steps,
        "tau": (sum(accepted) + steps) / steps if steps else 0.0,
        "accept_rate_by_position": [sum(n for a, n in hist.items() if a >= k) / steps for k in range(1, depth + 1)]
        if steps else [],
        "accepted_length_histogram": [hist.get(a, 0) for a in range(depth + 1)],
        "seconds": {k: round(v, 4) for k, v in split.items()}, "wall_seconds": round(wall, 4),
        "tokens_per_second": tokens / wall if wall > 0 else 0.0,
    }
