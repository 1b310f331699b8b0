"""A sampled draft chain's work between two head forwards as one Triton kernel, beside its torch reference: the
log-softmax over the draft vocabulary (the law the token is drawn from, which verification needs), the
Gumbel-max draw argmax(logp / T + g), the draft id mapped to its target id (d2t), and that token's embedding row,
the next step's input. torch runs it as ~9 kernels a step (log-softmax, mul, add, argmax, gather, index, add,
embedding, a cast: kernels/aot.py's count); inside the draft loop's CUDA graph each is a launch gap.
On CPU the kernel runs under TRITON_INTERPRET=1 (tests/infer/kernels/test_sampled_pick.py).
Shapes: R rows (one per sequence), N draft vocabulary, V target vocabulary, H hidden.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from toolkit.infer.kernels.greedy_pick import (PICK_BLOCK_H, PICK_BLOCK_N, PICK_WARPS, _pick_out, _running_argmax,
                                               pick_embedding_out)
from toolkit.infer.kernels.pdl import launch_kw, wait_prior


def reference_sampled_pick(logits: torch.Tensor, gumbel: torch.Tensor, inv_temp: torch.Tensor, d2t: torch.Tensor,
                           embed_w: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """logits [R, N], gumbel [R, N] (zeros: the top-1), inv_temp [R], d2t [N], embed_w [V, H] -> (log-probs
    [R, N] float32, target ids [R] int64, their embedding rows [R, H] or None). The first of equal maxima wins."""
    logp = torch.log_softmax(logits, -1, dtype=torch.float32)
    ids = (logp * inv_temp.float()[:, None] + gumbel.float()).argmax(-1)
    tok = ids + d2t[ids]
    return logp, tok, None if embed_w is None else embed_w[tok]


@triton.jit
def _sampled_pick_kernel(logit_ptr, g_ptr, it_ptr, d2t_ptr, emb_ptr, logp_ptr, tok_ptr, out_ptr, N, H, s_logit, s_g,
                         s_logp, s_emb, s_out, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr,
                         PDL: tl.constexpr):
    wait_prior(PDL)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.full([], 0.0, tl.float32)
    for start in range(0, N, BLOCK_N):                         # pass 1: the row's max and sum of exp, online
        ok = start + cols < N
        x = tl.load(logit_ptr + row * s_logit + start + cols, mask=ok, other=float("-inf")).to(tl.float32)
        new_m = tl.maximum(m, tl.max(x, 0))
        s = s * tl.exp(m - new_m) + tl.sum(tl.exp(x - new_m), 0)
        m = new_m
    lse = m + tl.log(s)
    inv_temp = tl.load(it_ptr + row).to(tl.float32)
    best = tl.full([], float("-inf"), tl.float32)
    best_i = tl.full([], 0, tl.int64)
    for start in range(0, N, BLOCK_N):                         # pass 2: the log-probs, and the noisy running argmax
        ok = start + cols < N
        x = tl.load(logit_ptr + row * s_logit + start + cols, mask=ok, other=0.0).to(tl.float32)
        lp = x - lse
        tl.store(logp_ptr + row * s_logp + start + cols, lp, mask=ok)
        score = lp * inv_temp + tl.load(g_ptr + row * s_g + start + cols, mask=ok, other=0.0).to(tl.float32)
        best, best_i = _running_argmax(tl.where(ok, score, float("-inf")), start, best, best_i)
    _pick_out(d2t_ptr, emb_ptr, tok_ptr, out_ptr, row, best_i, H, s_emb, s_out, BLOCK_H)


def sampled_pick(logits: torch.Tensor, gumbel: torch.Tensor, inv_temp: torch.Tensor, d2t: torch.Tensor,
                 embed_w: torch.Tensor | None, block_n: int = PICK_BLOCK_N // 2, block_h: int = PICK_BLOCK_H,
                 num_warps: int = PICK_WARPS) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """reference_sampled_pick as one kernel, one program per row. logits [R, N] and gumbel [R, N] with contiguous
    rows, inv_temp [R], d2t [N] int64, embed_w [V, H] (rows contiguous), or None for no embedding (a chain's last
    step). Blocks of 8,192: pass 2 holds four values a column (greedy_pick's note on the launch)."""
    R, N = logits.shape
    if d2t.shape != (N,):
        raise ValueError(f"sampled_pick: d2t {tuple(d2t.shape)} does not cover the {N} draft ids of the logits")
    if gumbel.shape != (R, N) or inv_temp.shape != (R,):
        raise ValueError(f"sampled_pick: gumbel {tuple(gumbel.shape)} and inv_temp {tuple(inv_temp.shape)} must be "
                         f"({R}, {N}) and ({R},)")
    if logits.stride(-1) != 1 or gumbel.stride(-1) != 1 or (embed_w is not None and embed_w.stride(-1) != 1):
        raise ValueError("sampled_pick needs contiguous logits, noise and embedding rows")
    d2t = d2t.long().contiguous()  # no-ops for a head's d2t buffer
    logp = torch.empty(R, N, dtype=torch.float32, device=logits.device)
    tok = torch.empty(R, dtype=torch.long, device=logits.device)
    H, emb, out = pick_embedding_out(embed_w, d2t, R)
    _sampled_pick_kernel[(R,)](logits, gumbel, inv_temp, d2t, emb, logp, tok, d2t if out is None else out, N, H,
                               logits.stride(0), gumbel.stride(0), logp.stride(0), emb.stride(0),
                               0 if out is None else out.stride(0), BLOCK_N=min(block_n, triton.next_power_of_2(N)),
                               BLOCK_H=min(block_h, triton.next_power_of_2(max(H, 1))), num_warps=num_warps,
                               **launch_kw(logits.device, R))
    return logp, tok, out
