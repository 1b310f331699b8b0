"""A greedy draft chain's work between two head forwards as one Triton kernel, beside its torch reference:
the argmax over the draft vocabulary, the draft id mapped to its target id (d2t), and that token's embedding
row, the next step's input. torch runs it as 4 kernels (argmax, index, add, embedding); inside the draft
loop's CUDA graph each is a launch gap, paid at every step of every round.
On CPU the kernel runs under TRITON_INTERPRET=1 (tests/infer/kernels/test_greedy_pick.py).
Shapes: R rows (one per sequence), N draft vocabulary, V target vocabulary, H hidden.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from toolkit.infer.kernels.pdl import launch_kw, wait_prior


def reference_greedy_pick(logits: torch.Tensor, d2t: torch.Tensor, embed_w: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [R, N], d2t [N] (draft id i -> target id i + d2t[i]), embed_w [V, H] -> (target ids [R] int64,
    their embedding rows [R, H]). The argmax is the first of equal maxima, as torch.argmax's."""
    ids = logits.argmax(-1)
    tok = ids + d2t[ids]
    return tok, embed_w[tok]


@triton.jit
def _running_argmax(x, start, best, best_i):
    """One block x of a row starting at column `start` folded into the running (max, first index of it): a later
    block replaces it only with a strictly larger value, so the first of equal maxima wins, as torch.argmax's."""
    top = tl.max(x, 0)
    i = tl.argmax(x, 0, tie_break_left=True).to(tl.int64) + start
    better = top > best
    return tl.where(better, top, best), tl.where(better, i, best_i)


@triton.jit
def _pick_out(d2t_ptr, emb_ptr, tok_ptr, out_ptr, row, draft_id, H, s_emb, s_out, BLOCK_H: tl.constexpr):
    """Row `row`'s chosen draft id mapped to its target id (d2t), stored, and that token's embedding row copied
    to the output (H = 0: none)."""
    tok = draft_id + tl.load(d2t_ptr + draft_id)
    tl.store(tok_ptr + row, tok)
    hs = tl.arange(0, BLOCK_H)
    for start in range(0, H, BLOCK_H):                         # the token's embedding row, the next input
        ok = start + hs < H
        e = tl.load(emb_ptr + tok * s_emb + start + hs, mask=ok, other=0.0)
        tl.store(out_ptr + row * s_out + start + hs, e.to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _greedy_pick_kernel(logit_ptr, d2t_ptr, emb_ptr, tok_ptr, out_ptr, N, H, s_logit, s_emb, s_out,
                        BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr):
    wait_prior(PDL)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    best = tl.full([], float("-inf"), tl.float32)
    best_i = tl.full([], 0, tl.int64)
    for start in range(0, N, BLOCK_N):                         # the row in blocks: a running (max, first index)
        ok = start + cols < N
        x = tl.load(logit_ptr + row * s_logit + start + cols, mask=ok, other=float("-inf")).to(tl.float32)
        best, best_i = _running_argmax(x, start, best, best_i)
    _pick_out(d2t_ptr, emb_ptr, tok_ptr, out_ptr, row, best_i, H, s_emb, s_out, BLOCK_H)


# One program per row walks the whole row, each block a dependent round trip (L2 for the logits just written, DRAM
# for the embedding row), so a row takes few wide blocks across many warps: 16 warps hold 16,384 fp32 logits at 32
# a thread (a 32k draft vocabulary in 2 blocks, where 4,096 over 4 warps took 8) and a 4,096-wide bf16 embedding
# row in one (4 before). kernels/aot.py compiles them without spills.
PICK_BLOCK_N, PICK_BLOCK_H, PICK_WARPS = 16384, 4096, 16


def pick_embedding_out(embed_w: torch.Tensor | None, d2t: torch.Tensor, R: int):
    """(H, the embedding table the kernel reads, the [R, H] rows it writes): with no embedding (a chain's last
    step) H = 0, so the embedding loop runs no iterations, and d2t stands in for the unused pointers."""
    if embed_w is None:
        return 0, d2t, None
    return embed_w.shape[1], embed_w, torch.empty(R, embed_w.shape[1], dtype=embed_w.dtype, device=embed_w.device)


def greedy_pick(logits: torch.Tensor, d2t: torch.Tensor, embed_w: torch.Tensor | None, block_n: int = PICK_BLOCK_N,
                block_h: int = PICK_BLOCK_H, num_warps: int = PICK_WARPS) -> tuple[torch.Tensor, torch.Tensor | None]:
    """reference_greedy_pick as one kernel, one program per row. logits [R, N] (last dimension contiguous),
    d2t [N] int64, embed_w [V, H] (rows contiguous), or None for the ids alone (a chain's last step)."""
    R, N = logits.shape
    if d2t.shape != (N,):
        raise ValueError(f"greedy_pick: d2t {tuple(d2t.shape)} does not cover the {N} draft ids of the logits")
    if logits.stride(-1) != 1 or (embed_w is not None and embed_w.stride(-1) != 1):
        raise ValueError("greedy_pick needs contiguous logits rows and embedding rows")
    d2t = d2t.long().contiguous()  # no-ops for a head's d2t buffer
    tok = torch.empty(R, dtype=torch.long, device=logits.device)
    H, emb, out = pick_embedding_out(embed_w, d2t, R)
    _greedy_pick_kernel[(R,)](logits, d2t, emb, tok, d2t if out is None else out, N, H, logits.stride(0),
                              emb.stride(0), 0 if out is None else out.stride(0),
                              BLOCK_N=min(block_n, triton.next_power_of_2(N)),
                              BLOCK_H=min(block_h, triton.next_power_of_2(max(H, 1))), num_warps=num_warps,
                              **launch_kw(logits.device, R))
    return tok, out
