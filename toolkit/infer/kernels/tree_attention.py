"""Attention of T new tokens over a KV cache under an arbitrary boolean mask (prefix + draft tree), as a Triton
kernel with an online softmax (flash-decoding style), beside its torch reference.

q [B, Hq, T, D], k/v [B, Hkv, S, D], mask [B, T, S] (True / nonzero = may attend) -> out [B, Hq, T, D].
  * Grouped-query packing: one program serves all Hq / Hkv query heads of a kv head for its tokens (rows
    r = t * groups + g), so each key/value block is loaded once per kv head, not once per query head, and a
    decode step (T = 1) fills the matrix unit's 16 rows with 4+ heads instead of 1 token.
  * Split-KV: a sequence's lens[b] slots are cut into `splits` chunks walked by separate programs (a decode
    step has only B * Hkv row blocks, far fewer than the GPU's multiprocessors); a second kernel merges their
    partial softmax sums. One split writes the output directly. The chunks are cut from lens[b] inside the
    kernel, not from the cache's length: a CUDA graph attends over the whole cache (S slots, fixed at capture),
    and chunks of S / splits would leave a 1k-token sequence in a 32k-slot cache to one or two programs that
    walk it serially, while the others find nothing to read.
  * `lens` [B]: slots past lens[b] are never read (CUDA graphs attend over the whole cache; a sequence's
    mask ends long before it).
  * `sinks` [Hq] (GPT-OSS): a logit per query head that joins the softmax's denominator with no value; added
    once, where a row's sums are final (the one split's end, or the merge).
  * `softcap` (Gemma 2's attn_logit_softcapping): scores become cap * tanh(scores / cap) before the mask, with
    `scale` (Gemma's query_pre_attn_scalar ** -0.5) in place of D ** -0.5.
On CPU it runs under TRITON_INTERPRET=1 (tests); there tl.dot is wrong for bf16, so inputs are upcast.
Measured against SDPA on a GPU: benchmarks/bench_attention.py, benchmarks/RESULTS.md.
"""
from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from toolkit.infer.kernels import shared_memory
from toolkit.infer.kernels.pdl import launch_kw, wait_prior


def reference_attention(q, k, v, mask, scale: float | None = None, sinks: torch.Tensor | None = None,
                        softcap: float | None = None) -> torch.Tensor:
    """The torch reference: scaled dot-product attention with the same mask (and sinks: a column per head of
    the softmax, dropped after it; softcap: the scores soft-capped)."""
    B, HQ, T, _ = q.shape
    groups = HQ // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = (q.float() @ k.float().transpose(-1, -2)) * (scale or 1 / math.sqrt(q.shape[-1]))
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask.bool()[:, None], float("-inf"))
    if sinks is not None:
        sink = sinks.float().view(1, HQ, 1, 1).expand(B, HQ, T, 1)
        return (torch.cat([scores, sink], -1).softmax(-1)[..., :-1] @ v.float()).to(q.dtype)
    return (scores.softmax(-1).nan_to_num(0.0) @ v.float()).to(q.dtype)


@triton.jit
def _attention_kernel(q_ptr, k_ptr, v_ptr, m_ptr, len_ptr, o_ptr, po_ptr, pm_ptr, pl_ptr, sink_ptr,
                      sqb, sqh, sqt, skb, skh, sks, svb, svh, svs, smb, smt, sob, soh, sot,
                      T, D, HQ, HKV, GROUPS, scale, NUM_SPLITS, cap,
                      BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
                      UPCAST: tl.constexpr, PARTIAL: tl.constexpr, SINKS: tl.constexpr, PDL: tl.constexpr,
                      SOFTCAP: tl.constexpr = False):
    wait_prior(PDL)
    # int64: b * skb passes 2**31 elements in one layer's cache view of a large batch x max_len
    b, kvh = (tl.program_id(0) // HKV).to(tl.int64), tl.program_id(0) % HKV
    r = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)           # packed rows: token t, query head h
    t, h = r // GROUPS, kvh * GROUPS + r % GROUPS
    split = tl.program_id(2)
    d = tl.arange(0, BLOCK_D)
    row_ok, d_ok = t < T, d < D
    q = tl.load(q_ptr + b * sqb + h[:, None] * sqh + t[:, None] * sqt + d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    seq_len = tl.load(len_ptr + b)
    split_len = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_S) * BLOCK_S  # the sequence cut evenly, whole blocks
    lo = split * split_len
    hi = tl.minimum(lo + split_len, seq_len)                          # this split's slots, within the sequence
    m_i = tl.full([BLOCK_R], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    for s0 in range(lo, hi, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        s_ok = s < hi
        k = tl.load(k_ptr + b * skb + kvh * skh + s[:, None] * sks + d[None, :], mask=s_ok[:, None] & d_ok[None, :],
                    other=0.0)
        v = tl.load(v_ptr + b * svb + kvh * svh + s[:, None] * svs + d[None, :], mask=s_ok[:, None] & d_ok[None, :],
                    other=0.0)
        if UPCAST:
            k, v = k.to(tl.float32), v.to(tl.float32)
        allowed = tl.load(m_ptr + b * smb + t[:, None] * smt + s[None, :], mask=row_ok[:, None] & s_ok[None, :],
                          other=0) != 0
        scores = tl.dot(q, tl.trans(k), input_precision="ieee") * scale  # [BLOCK_R, BLOCK_S]; fp32: no tf32
        if SOFTCAP:  # cap * tanh(scores / cap), tanh(x) = 1 - 2 / (exp(2x) + 1): +-1 where exp over/underflows
            scores = cap * (1.0 - 2.0 / (tl.exp(2.0 * scores / cap) + 1.0))
        scores = tl.where(allowed, scores, -1.0e30)
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        p = tl.where(allowed, tl.exp(scores - m_new[:, None]), 0.0)   # masked slots add nothing
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        m_i = m_new
    if PARTIAL:  # unnormalised partial sums of this split: [B, Hq, T, splits(, D)]
        row = ((b * HQ + h) * T + t) * NUM_SPLITS + split
        tl.store(po_ptr + row[:, None] * D + d[None, :], acc, mask=row_ok[:, None] & d_ok[None, :])
        tl.store(pm_ptr + row, m_i, mask=row_ok)
        tl.store(pl_ptr + row, l_i, mask=row_ok)
    else:
        if SINKS:  # the sink's exp(sink - max) joins the denominator, all rescaled to the larger max
            sink = tl.load(sink_ptr + h, mask=row_ok, other=0.0).to(tl.float32)
            m_all = tl.maximum(m_i, sink)
            rescale = tl.exp(m_i - m_all)
            l_i = l_i * rescale + tl.exp(sink - m_all)
            acc = acc * rescale[:, None]
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]             # a row that sees nothing gives zeros
        tl.store(o_ptr + b * sob + h[:, None] * soh + t[:, None] * sot + d[None, :], out.to(o_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & d_ok[None, :])


@triton.jit
def _merge_kernel(po_ptr, pm_ptr, pl_ptr, o_ptr, sink_ptr, sob, soh, sot, T, D, HQ, NUM_SPLITS,
                  BLOCK_SPLITS: tl.constexpr, BLOCK_D: tl.constexpr, SINKS: tl.constexpr, PDL: tl.constexpr):
    wait_prior(PDL)
    row = tl.program_id(0)                                             # (b * Hq + h) * T + t
    b, h, t = row // (HQ * T), (row // T) % HQ, row % T
    sp, d = tl.arange(0, BLOCK_SPLITS), tl.arange(0, BLOCK_D)
    sp_ok = sp < NUM_SPLITS
    m = tl.load(pm_ptr + row * NUM_SPLITS + sp, mask=sp_ok, other=-1.0e30)
    l = tl.load(pl_ptr + row * NUM_SPLITS + sp, mask=sp_ok, other=0.0)
    acc = tl.load(po_ptr + (row * NUM_SPLITS + sp)[:, None] * D + d[None, :], mask=sp_ok[:, None] & (d[None, :] < D),
                  other=0.0)
    m_all = tl.max(m, 0)
    if SINKS:
        sink = tl.load(sink_ptr + h).to(tl.float32)
        m_all = tl.maximum(m_all, sink)
    w = tl.exp(m - m_all)                                              # each split rescaled to the common max
    total = tl.sum(w * l, 0)
    if SINKS:
        total += tl.exp(sink - m_all)
    out = tl.sum(w[:, None] * acc, 0) / tl.where(total > 0, total, 1.0)
    tl.store(o_ptr + b * sob + h * soh + t * sot + d, out.to(o_ptr.dtype.element_ty), mask=d < D)


def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def tree_attention(q, k, v, mask, scale: float | None = None, lens: torch.Tensor | None = None,
                   splits: int | None = None, block_s: int = 32, num_warps: int = 4,
                   sinks: torch.Tensor | None = None, softcap: float | None = None) -> torch.Tensor:
    """mask bool or int8 [B, T, S]; lens int [B] (default S): slots at or past lens[b] are not read; sinks [Hq]
    or None; scale (default D ** -0.5) and softcap (a positive cap, or None) as reference_attention's.
    splits: chunks of each sequence's lens[b] slots (default: enough programs for ~2 waves on the device, at most
    one per block of block_s slots). The defaults are an H200's fastest for a batch-1 decode / verify step over
    1k slots (one 32-slot block per program: 10.3 -> 9.1 us a layer with the merge) and within 1% of it over 4k
    (benchmarks/bench_attention_splits.py, RESULTS.md)."""
    B, HQ, T, D = q.shape
    S, HKV = k.shape[2], k.shape[1]
    if HQ % HKV:
        raise ValueError(f"{HQ} query heads are not a multiple of {HKV} kv heads")
    if sinks is not None and sinks.shape != (HQ,):
        raise ValueError(f"sinks shape {tuple(sinks.shape)} != (query heads,) {(HQ,)}")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap must be a positive number or None; got {softcap}")
    if mask.shape != (B, T, S):
        raise ValueError(f"mask shape {tuple(mask.shape)} != (batch, new tokens, slots) {(B, T, S)}")
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("q/k/v need a contiguous last (head) dimension")  # cache views are: no copy needed
    m = mask if mask.dtype == torch.int8 and mask.stride(-1) == 1 else mask.to(torch.int8).contiguous()
    if lens is None:
        lens = torch.full((B,), S, dtype=torch.int32, device=q.device)
    # the interpreter's bf16 tl.dot is wrong: upcast there; fp16 runs the half path a GPU runs
    groups, interpret = HQ // HKV, os.environ.get("TRITON_INTERPRET") == "1"
    block_r = min(64, max(16, triton.next_power_of_2(T * groups)))
    block_d, e = max(16, triton.next_power_of_2(D)), q.element_size()
    # head_dim 256 with 64 rows takes 100 KB on sm_86 / 89 at 3 stages, over their 99 KB: 2 stages there
    q_bytes = 2 * e if shared_memory.operands_in_shared(q.device) else \
        e if shared_memory.async_copies(q.device) else max(e, 4)
    stages, block_r, block_s = shared_memory.attention_tile(block_r, block_s, block_d, e, q_bytes,
                                                            shared_memory.max_shared(q.device))
    row_blocks = triton.cdiv(T * groups, block_r)
    if splits is None:
        splits = max(1, min(triton.cdiv(2 * _num_sms(q.device), B * HKV * row_blocks), triton.cdiv(S, block_s)))
    if splits < 1:
        raise ValueError(f"splits must be >= 1; got {splits}")
    out = torch.empty_like(q)
    partial = splits > 1
    po = torch.empty(B * HQ * T * splits * D if partial else 1, dtype=torch.float32, device=q.device)
    pm = torch.empty(B * HQ * T * splits if partial else 1, dtype=torch.float32, device=q.device)
    pl = torch.empty_like(pm)
    _attention_kernel[(B * HKV, row_blocks, splits)](
        q, k, v, m, lens, out, po, pm, pl, q if sinks is None else sinks, q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2), m.stride(0), m.stride(1),
        out.stride(0), out.stride(1), out.stride(2), T, D, HQ, HKV, groups, scale or 1 / math.sqrt(D), splits,
        float(softcap or 1.0), BLOCK_R=block_r, BLOCK_S=block_s, BLOCK_D=block_d, UPCAST=interpret and q.dtype == torch.bfloat16,
        PARTIAL=partial, SINKS=sinks is not None, SOFTCAP=softcap is not None, num_warps=num_warps,
        num_stages=stages, **launch_kw(q.device, B * T))
    if partial:
        _merge_kernel[(B * HQ * T,)](po, pm, pl, out, q if sinks is None else sinks, out.stride(0), out.stride(1),
                                     out.stride(2), T, D, HQ, splits, BLOCK_D=block_d, SINKS=sinks is not None,
                                     BLOCK_SPLITS=max(2, triton.next_power_of_2(splits)),
                                     **launch_kw(q.device, B * T))
    return out


def reference_mask_lens(mask: torch.Tensor) -> torch.Tensor:
    """bool [B, T, S] -> int32 [B]: one past the last slot any of row b's tokens may see (0 if none)."""
    seen = torch.arange(1, mask.shape[-1] + 1, device=mask.device) * mask.any(1)       # [B, S]
    return seen.amax(-1).to(torch.int32)


@triton.jit
def _mask_lens_kernel(m_ptr, out_ptr, T, S, smb, smt, BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr,
                      PDL: tl.constexpr):
    wait_prior(PDL)
    b = tl.program_id(0)
    tt, ss = tl.arange(0, BLOCK_T), tl.arange(0, BLOCK_S)
    best = tl.zeros([BLOCK_T, BLOCK_S], tl.int32)
    for t0 in range(0, T, BLOCK_T):                            # a tile of tokens x slots a load
        t = t0 + tt
        for s0 in range(0, S, BLOCK_S):
            s = s0 + ss
            seen = tl.load(m_ptr + b * smb + t[:, None] * smt + s[None, :], mask=(t < T)[:, None] & (s < S)[None, :],
                           other=0) != 0
            best = tl.maximum(best, tl.where(seen, s[None, :] + 1, 0))
    tl.store(out_ptr + b, tl.max(tl.max(best, 1), 0))


# A row's mask is read by one program, block after block, each load a round trip. Under CUDA graphs the mask spans
# the whole cache (graphs.py), so a verify step of 8 tokens in an engine with 32k slots walked 8 x 32 blocks of
# 1,024 slots: tiles of 16,384 mask bytes over 16 warps walk it in 16.
LENS_TILE, LENS_WARPS = 16384, 16


def mask_lens(mask: torch.Tensor, tile: int = LENS_TILE, num_warps: int = LENS_WARPS) -> torch.Tensor:
    """reference_mask_lens as one kernel (it was five: arange, any, mul, amax, cast) for an int8 / bool mask
    [B, T, S] with a contiguous last dimension: one program per row, tiles of up to `tile` (tokens x slots)."""
    B, T, S = mask.shape
    if mask.stride(-1) != 1:
        raise ValueError("mask_lens needs a contiguous last dimension")
    m = mask.view(torch.int8) if mask.dtype == torch.bool else mask
    out = torch.empty(B, dtype=torch.int32, device=mask.device)
    block_t = min(triton.next_power_of_2(max(T, 1)), 16)
    block_s = min(max(tile // block_t, 16), triton.next_power_of_2(max(S, 1)))
    _mask_lens_kernel[(B,)](m, out, T, S, m.stride(0), m.stride(1), BLOCK_T=block_t, BLOCK_S=block_s,
                            num_warps=num_warps, **launch_kw(mask.device, B * T))
    return out
