"""Training-time test (TTT) attention for EAGLE-3: the head unrolled for K steps over a whole sequence.

At step i the query at position t attends to the causal prefix of step-0 keys (k_0[0..t]) plus its own
diagonal keys from steps 1..i (k_1[t], ..., k_i[t]): what the head sees at inference after i draft steps.
Computed blockwise over query rows, so no L x L score matrix is ever held (memory O(block x L)); the
diagonal terms join the same softmax through a shared running max. Shapes: B batch, H query heads, Hkv
key/value heads, L positions, D head dim.
"""
from __future__ import annotations

import math

import torch


def ttt_attention(q: torch.Tensor, ks: list[torch.Tensor], vs: list[torch.Tensor], block: int = 128,
                  valid: torch.Tensor | None = None) -> torch.Tensor:
    """q [B, H, L, D]; ks/vs: step 0..i keys/values [B, Hkv, L, D]; valid bool [B, L] marks real (not padded)
    key positions of step 0. Returns [B, H, L, D]."""
    B, H, L, D = q.shape
    groups = H // ks[0].shape[1]
    ks = [k.repeat_interleave(groups, 1) if groups > 1 else k for k in ks]
    vs = [v.repeat_interleave(groups, 1) if groups > 1 else v for v in vs]
    scale = 1.0 / math.sqrt(D)
    chunks = []
    # diagonal scores of steps 1..i: [B, H, L, i]
    diag = torch.stack([(q * k).sum(-1) for k in ks[1:]], -1) * scale if len(ks) > 1 else None
    for r0 in range(0, L, block):
        r1 = min(r0 + block, L)
        s = (q[:, :, r0:r1] @ ks[0][:, :, :r1].transpose(-1, -2)).float() * scale   # [B, H, rows, r1]
        causal = torch.arange(r1, device=q.device)[None, :] <= torch.arange(r0, r1, device=q.device)[:, None]
        allowed = causal[None, None] if valid is None else causal[None, None] & valid[:, None, None, :r1]
        s = s.masked_fill(~allowed, float("-inf"))
        parts = [s] if diag is None else [s, diag[:, :, r0:r1].float()]
        m = torch.cat([p.amax(-1, keepdim=True) for p in parts], -1).amax(-1, keepdim=True)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        p0 = (s - m).exp()                                                             # [B, H, rows, r1]
        total = p0.sum(-1, keepdim=True)
        acc = p0.to(vs[0].dtype) @ vs[0][:, :, :r1]
        if diag is not None:
            pd = (diag[:, :, r0:r1].float() - m).exp()                                 # [B, H, rows, i]
            total = total + pd.sum(-1, keepdim=True)
            for j, v in enumerate(vs[1:]):
                acc = acc + pd[..., j:j + 1].to(v.dtype) * v[:, :, r0:r1]
        chunks.append((acc / total.clamp_min(1e-30).to(acc.dtype)).to(q.dtype))
    return torch.cat(chunks, 2)
