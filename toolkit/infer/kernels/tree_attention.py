"""Attention of T new tokens over a KV cache under an arbitrary boolean mask (prefix + draft tree), as one
Triton kernel with an online softmax (flash-attention style), beside its torch reference.

q [B, Hq, T, D], k/v [B, Hkv, S, D], mask bool [B, T, S] (True = may attend) -> out [B, Hq, T, D].
Grouped-query attention: query head h reads kv head h // (Hq / Hkv). One program per (batch, query head,
block of 16 queries); the cache is walked in blocks of BLOCK_S slots. Decode is T = 1 (one query block).
On CPU it runs under TRITON_INTERPRET=1 (tests); there tl.dot is wrong for bf16, so inputs are upcast.
Speed is measured on a GPU (benchmarks/RESULTS.md) before the engine uses it by default.
"""
from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl


def reference_attention(q, k, v, mask, scale: float | None = None) -> torch.Tensor:
    """The torch reference: scaled dot-product attention with the same mask."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = (q.float() @ k.float().transpose(-1, -2)) * (scale or 1 / math.sqrt(q.shape[-1]))
    scores = scores.masked_fill(~mask[:, None], float("-inf"))
    return (scores.softmax(-1).nan_to_num(0.0) @ v.float()).to(q.dtype)


@triton.jit
def _tree_attention_kernel(q_ptr, k_ptr, v_ptr, m_ptr, o_ptr,
                           sqb, sqh, sqt, skb, skh, sks, svb, svh, svs, smb, smt, sob, soh, sot,
                           T, S, D, HQ, GROUPS, scale,
                           BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
                           UPCAST: tl.constexpr):
    bh = tl.program_id(0)
    b, h = bh // HQ, bh % HQ
    kvh = h // GROUPS
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    d = tl.arange(0, BLOCK_D)
    q = tl.load(q_ptr + b * sqb + h * sqh + t[:, None] * sqt + d[None, :],
                mask=(t[:, None] < T) & (d[None, :] < D), other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_T], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_T], tl.float32)
    acc = tl.zeros([BLOCK_T, BLOCK_D], tl.float32)
    for s0 in range(0, S, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        kv_mask = (s[:, None] < S) & (d[None, :] < D)
        k = tl.load(k_ptr + b * skb + kvh * skh + s[:, None] * sks + d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + b * svb + kvh * svh + s[:, None] * svs + d[None, :], mask=kv_mask, other=0.0)
        if UPCAST:
            k, v = k.to(tl.float32), v.to(tl.float32)
        allowed = tl.load(m_ptr + b * smb + t[:, None] * smt + s[None, :],
                          mask=(t[:, None] < T) & (s[None, :] < S), other=0) != 0
        scores = tl.dot(q, tl.trans(k), input_precision="ieee") * scale                       # [BLOCK_T, BLOCK_S]
        scores = tl.where(allowed, scores, -1.0e30)
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        p = tl.where(allowed, tl.exp(scores - m_new[:, None]), 0.0)   # masked slots add nothing
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")  # fp32: no tf32
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]                 # a row that sees nothing gives zeros
    tl.store(o_ptr + b * sob + h * soh + t[:, None] * sot + d[None, :], out.to(o_ptr.dtype.element_ty),
             mask=(t[:, None] < T) & (d[None, :] < D))


def tree_attention(q, k, v, mask, scale: float | None = None, block_s: int = 32) -> torch.Tensor:
    B, HQ, T, D = q.shape
    S, HKV = k.shape[2], k.shape[1]
    if HQ % HKV:
        raise ValueError(f"{HQ} query heads are not a multiple of {HKV} kv heads")
    if mask.shape != (B, T, S):
        raise ValueError(f"mask shape {tuple(mask.shape)} != (batch, new tokens, slots) {(B, T, S)}")
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("q/k/v need a contiguous last (head) dimension")  # cache views are: no copy needed
    m = mask.to(torch.int8).contiguous()
    out = torch.empty_like(q)
    block_t, block_d = 16, max(16, triton.next_power_of_2(D))
    grid = (B * HQ, triton.cdiv(T, block_t))
    _tree_attention_kernel[grid](
        q, k, v, m, out, q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), m.stride(0), m.stride(1), out.stride(0), out.stride(1),
        out.stride(2), T, S, D, HQ, HQ // HKV, scale or 1 / math.sqrt(D),
        BLOCK_T=block_t, BLOCK_S=block_s, BLOCK_D=block_d, UPCAST=os.environ.get("TRITON_INTERPRET") == "1")
    return out
