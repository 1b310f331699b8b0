"""How admitted prompts are prefilled: right-padded groups of neighbours of similar length, and a prefix cache hit
alone, from the position its copied prefix ends at (prefix_cache.py)."""
from __future__ import annotations

import torch


def pad(rows: list[list], value) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [value] * (width - len(r)) for r in rows])


def prefill_groups(lengths: list[int], waste: float = 1.25) -> list[range]:
    """Split prompts (in row order) into consecutive groups prefilled together, right-padded to the group's
    longest: a group grows while its padded tokens stay within `waste` x its real ones. One padded forward
    for prompts of 42..216 tokens cost 2.5x the same prompts one by one (SmolLM2, CPU, 48 rows)."""
    groups, start, longest, real = [], 0, 0, 0
    for i, n in enumerate(lengths):
        wide, real = max(longest, n), real + n
        if i > start and wide * (i + 1 - start) > waste * real:
            groups.append(range(start, i))
            start, wide, real = i, n, n
        longest = wide
    return groups + [range(start, len(lengths))]


def admission_groups(starts: list[int], lengths: list[int], group) -> list[tuple[range, int]]:
    """Prompts in row order as prefill groups with the position each starts from: a cache hit alone (it starts at
    its own position), the misses between hits grouped as `group` (prefill_groups) splits them."""
    out, i = [], 0
    while i < len(starts):
        if starts[i]:
            out.append((range(i, i + 1), starts[i]))
            i += 1
            continue
        j = next((j for j in range(i, len(starts)) if starts[j]), len(starts))
        out += [(range(i + g.start, i + g.stop), 0) for g in group(lengths[i:j])]
        i = j
    return out
