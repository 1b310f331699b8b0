"""EAGLE-3 training-time-test loss, accuracy and simulated acceptance length.

Step i at row t predicts token t + i + 2. Its target is the target model's distribution at position
t + i + 1, restricted to the draft vocabulary and renormalized (soft cross-entropy). A row counts when that
token is an assistant token (loss_mask) and the target's argmax is in the draft vocabulary; step i weighs
decay ** i. Accuracy is over every assistant token (as SpecForge's): a token the draft vocabulary lacks is a miss,
as it is when serving. Simulated tau = 1 + sum_k prod_{i <= k} acc_i (the bonus token counts, unlike
SpecForge's).

Under gradient accumulation and data parallelism the trainer passes `norm`: step i's loss is then the sum over
the micro-batch's counted rows divided by norm[i], the assistant tokens step i has in the whole optimizer step
(every micro-batch of every rank, step_counts) over the number of micro-batches that accelerate / DDP average.
A mean of per-micro-batch means would weigh a token of a short micro-batch more than one of a long one (the
gradient accumulation bug transformers fixed with `num_items_in_batch`).
"""
from __future__ import annotations

import torch


def step_counts(loss_mask: torch.Tensor, steps: int) -> torch.Tensor:
    """[K]: the assistant tokens step i predicts in a batch (loss_mask [B, L]; step i's rows are t + i + 2)."""
    return torch.stack([loss_mask[:, i + 2:].sum() for i in range(steps)]).float()


def ttt_loss(step_logits: list[torch.Tensor], target_logits: torch.Tensor, loss_mask: torch.Tensor,
             t2d: torch.Tensor, decay: float = 0.8, norm: torch.Tensor | None = None):
    """step_logits: K x [B, L, N]; target_logits [B, L, V]; loss_mask [B, L]; t2d bool [V]; norm [K] or None
    (each step's mean over this batch's own counted rows).
    Returns (weighted loss, per-step losses [K], per-step accuracies [K], counts [2, K]: per step the rows its
    loss counts and the assistant tokens its accuracy counts); the per-step losses are this batch's means over
    their rows whatever norm is (what the trainer logs)."""
    B, L, _ = target_logits.shape
    draft_ids = torch.nonzero(t2d).flatten()                                   # target id of each draft id
    # the target's distribution over the draft vocabulary, computed once for all steps
    full = len(draft_ids) == target_logits.shape[-1]  # EAGLE-1/2 and MTP: no [B, L, V] gather copy
    p_all = (target_logits if full else target_logits[..., draft_ids]).float().softmax(-1)   # [B, L, N]
    target_top = target_logits.argmax(-1)                                      # [B, L]
    total, losses, accs, counts = step_logits[0].sum() * 0.0, [], [], []  # a tensor even when nothing counts
    for i, logits in enumerate(step_logits):
        n = L - (i + 2)  # rows t with a token t + i + 2 to predict
        if n <= 0:  # a batch shorter than the unroll: nothing to count at this step (zeros keep K entries)
            zero = logits.sum() * 0.0
            losses.append(zero)
            accs.append(zero.detach())
            counts.append(torch.zeros(2, dtype=torch.long, device=logits.device))
            continue
        p = p_all[:, i + 1:i + 1 + n]                                          # [B, n, N]
        logq = logits[:, :n].float().log_softmax(-1)
        assistant = loss_mask[:, i + 2:i + 2 + n].bool()
        rows = assistant & t2d[target_top[:, i + 1:i + 1 + n]]
        ce = -(p * logq).sum(-1)                                               # [B, n]
        count = rows.sum()
        loss = (ce * rows).sum() / count.clamp_min(1)
        hit = draft_ids[logits[:, :n].argmax(-1)] == target_top[:, i + 1:i + 1 + n]
        tokens = assistant.sum()
        accs.append(((hit & rows).sum() / tokens.clamp_min(1)).detach())
        losses.append(loss)
        counts.append(torch.stack([count, tokens]))
        total = total + decay ** i * (loss if norm is None else (ce * rows).sum() / norm[i].clamp_min(1e-9))
    return total, torch.stack(losses), torch.stack(accs), torch.stack(counts, 1)


def simulated_tau(accs: torch.Tensor) -> float:
    """1 + sum_k prod_{i <= k} acc_i."""
    return float(1 + torch.cumprod(accs.double(), 0).sum())
