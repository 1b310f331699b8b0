"""Acceptance and speed metrics over engine results (per request and per run).

tau        tokens emitted per verify step, the bonus token included: mean(accepted + 1)
accept[k]  share of verify steps that accepted at least k draft tokens (k = 1..positions: the tree depth)
histogram  count of verify steps by accepted length 0, 1, ..., positions
from_lookup accepted draft tokens that only the prompt-lookup branch proposed (lookup.py; 0 without it)
draft_tokens draft tokens the verify steps checked (tree nodes after the root; vLLM's num_draft_tokens), and
           draft_acceptance_rate = accepted / draft_tokens (vLLM's "draft acceptance rate"; a tree's rate is low by
           design: one path of its nodes can be accepted)
seconds    prefill / draft / verify summed over the results; other = wall - those three (None without a wall)
"""
from __future__ import annotations

from collections import Counter

from toolkit.infer.sequence import Result


def summarize(results: list[Result], seconds: float | None = None, positions: int = 0) -> dict:
    """`seconds`: the run's wall time (None: unknown, then speed is over the engine's own time);
    `positions`: draft positions to report (the tree's num_steps; 0 = no draft), at least the longest
    accepted length seen."""
    accepted = [a for r in results for a in r.accepted]
    steps = len(accepted)
    hist = Counter(accepted)
    depth = max(positions, max(accepted, default=0))
    tokens = sum(len(r.tokens) for r in results)
    split = {k: sum(r.seconds[k] for r in results) for k in ("prefill", "draft", "verify")}
    engine_time = sum(split.values())
    if seconds is not None and seconds < engine_time - 1e-6:
        raise ValueError(f"wall time {seconds:.4f}s is shorter than the {engine_time:.4f}s the results spent in "
                         "prefill + draft + verify: give the wall time around the whole run")
    wall = seconds if seconds is not None else engine_time
    split["other"] = max(seconds - engine_time, 0.0) if seconds is not None else None
    return {
        "requests": len(results), "tokens": tokens, "verify_steps": steps,
        "tau": (sum(accepted) + steps) / steps if steps else 0.0,
        "accept_rate_by_position": [sum(n for a, n in hist.items() if a >= k) / steps if steps else 0.0
                                    for k in range(1, depth + 1)],
        "accepted_length_histogram": [hist.get(a, 0) for a in range(depth + 1)],
        "accepted_from_lookup": sum(r.from_lookup for r in results),
        "draft_tokens": (checked := sum(sum(r.checked) for r in results)),
        "draft_acceptance_rate": sum(accepted) / checked if checked else None,
        "seconds": {k: None if v is None else round(v, 4) for k, v in split.items()}, "wall_seconds": round(wall, 4),
        "tokens_per_second": tokens / wall if wall > 0 else 0.0,
    }
