"""Replayed acceptance: what the engine's greedy chain accepts, computed from one teacher-forced TTT pass.

The simulated tau of training (1 + sum_k prod_{i <= k} acc_i) averages each step's accuracy over every
position of an answer. The engine does not visit every position: a verify step that accepts a tokens jumps
a + 1 positions, so easy stretches are crossed in few steps and the steps it takes fall on the harder
positions more often (an inspection-paradox bias: the formula over-predicts). Replaying the jumps over the
per-position accepted lengths of a teacher-forced pass gives the engine's own sequence of accepted lengths,
step for step, when training and serving compute the same thing: any difference is a serving bug
(aux layers, masks, d2t), not noise.

Indexing as in losses.py: TTT step i at row t predicts token t + i + 2, which the target's argmax at
position t + i + 1 decides. After a prompt of P tokens the prefill emits token P; the first verify step
drafts from row P - 1.
"""
from __future__ import annotations

import torch


def accept_lengths(step_logits: list[torch.Tensor], target_top: torch.Tensor, draft_ids: torch.Tensor) -> torch.Tensor:
    """step_logits: K x [B, L, N] draft logits; target_top [B, L] target argmax; draft_ids [N] target id of each
    draft id. Returns [B, L] long: at row t, how many steps 0, 1, ... in a row predict the target's argmax
    (a chain of K drafts accepts this many from row t; steps past the sequence's end count as misses)."""
    B, L = target_top.shape
    hits = torch.zeros(len(step_logits), B, L, dtype=torch.long, device=target_top.device)
    for i, logits in enumerate(step_logits):
        n = L - (i + 2)
        if n > 0:
            hits[i, :, :n] = (draft_ids[logits[:, :n].argmax(-1)] == target_top[:, i + 1:i + 1 + n]).long()
    return hits.cumprod(0).sum(0)


def replay_chain(lengths: torch.Tensor, prompt_len: int, new_tokens: int) -> list[int]:
    """lengths [L] of one sequence (accept_lengths); the answer's new_tokens follow prompt_len prompt tokens.
    Returns the accepted length of each verify step the engine takes (the bonus token not counted), the last
    step cut where the answer ends, as the engine stops where plain decoding would."""
    lengths = lengths.tolist()
    row, emitted, accepted = prompt_len - 1, 1, []
    while emitted < new_tokens:
        take = min(lengths[row] + 1, new_tokens - emitted)
        accepted.append(take - 1)
        emitted += take
        row += take
    return accepted


def replayed_tau(accepted: list[list[int]]) -> float:
    """Tokens per verify step (the bonus included) over every sequence's replayed steps."""
    steps = sum(len(a) for a in accepted)
    return (sum(map(sum, accepted)) + steps) / steps if steps else 0.0
