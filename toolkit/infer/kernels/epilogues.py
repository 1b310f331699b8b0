"""Epilogues that pair two rows of a projection, for kernels/gemv.py's two kernels, beside their torch references:

  "silu"  the MLP's fused gate/up projection -> silu(gate) * up [.., I]: the gate row n and its up row n + I
  "rope"  the attention's fused q/k/v projection -> RoPE on q and k, k and v written into the KV cache at their
          slots, q returned [B, Hq, T, D]: head dimension d < D/2 and d + D/2 (the HF half-split rotation)

Why: the unfused layer stores the projection, then a kernel of its own reads it back (layer_ops.silu_mul, or
layer_ops.rope_cache_write): one more launch per layer and step, ~2 us each inside a CUDA graph on an H100 / H200,
and a verify step of 8 tokens runs both (benchmarks/RESULTS.md). Here a program owns BLOCK_N / 2 such pairs, their
rows interleaved (lo, hi, lo, hi, ...; pair_rows), so the K loop is the kernel's own and each row's sum comes out
as the unfused kernel's with the same config; the epilogue rounds the product as the unfused kernel stores it, then
computes exactly what the separate kernel computes from that (store_pairs). TOOLKIT_EPILOGUES picks it ("off",
"on", "auto": on where the device's gemv_configs.json entry says `"epilogues": true`, which a measurement on that
device sets: benchmarks/gpu/lease.sh times both). Tested on CPU under TRITON_INTERPRET=1
(tests/infer/kernels/test_epilogues.py).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

EPILOGUES = (None, "silu", "rope")
MODES = ("auto", "on", "off")


def enabled(device: torch.device) -> bool:
    """Whether model.row_step asks gemv for the paired epilogues on `device` (TOOLKIT_EPILOGUES, see above)."""
    mode = os.environ.get("TOOLKIT_EPILOGUES", "auto")
    if mode not in MODES:
        raise ValueError(f"TOOLKIT_EPILOGUES={mode!r}; accepted: {', '.join(MODES)}")
    if mode != "auto":
        return mode == "on"
    from toolkit.infer.kernels.gemv import _device_name, tuned_configs

    return bool(tuned_configs(_device_name(device)).get("epilogues", False))


@dataclass
class RopeWrite:
    """What the "rope" epilogue needs: cos / sin [B, 1, T, D] (attention.rope_cos_sin: sin's first half negated),
    slots [B, T] (the cache slots of the step's tokens), one layer's cache_k / cache_v [>= B, Hkv, S, D]."""
    cos: torch.Tensor
    sin: torch.Tensor
    slots: torch.Tensor
    cache_k: torch.Tensor
    cache_v: torch.Tensor
    num_heads: int
    num_kv_heads: int

    def check(self, lead: tuple, n: int) -> None:
        B, T = (lead[0], lead[1]) if len(lead) == 2 else (None, None)
        D = self.cos.shape[-1]
        want = (B, 1, T, D)
        if B is None or tuple(self.cos.shape) != want or tuple(self.sin.shape) != want \
                or not (self.cos.is_contiguous() and self.sin.is_contiguous()):
            raise ValueError(f"a rope epilogue needs x [B, T, K] and contiguous cos / sin [B, 1, T, D]; got x's "
                             f"leading shape {lead}, cos {tuple(self.cos.shape)}, sin {tuple(self.sin.shape)}")
        if D % 2 or n != (self.num_heads + 2 * self.num_kv_heads) * D:
            raise ValueError(f"a rope epilogue needs (Hq + 2 Hkv) * D = ({self.num_heads} + 2 * {self.num_kv_heads})"
                             f" * {D} output rows with D even; the weight has {n}")
        if tuple(self.slots.shape) != (B, T) or self.slots.dtype.is_floating_point:
            raise ValueError(f"a rope epilogue needs integer slots of shape {(B, T)}; got {tuple(self.slots.shape)}"
                             f" {self.slots.dtype}")
        for name, c in (("cache_k", self.cache_k), ("cache_v", self.cache_v)):
            if c.dim() != 4 or c.shape[0] < B or c.shape[1] != self.num_kv_heads or c.shape[3] != D \
                    or c.stride(-1) != 1:
                raise ValueError(f"{name} must be one layer's cache [>= {B}, {self.num_kv_heads}, S, {D}] with a "
                                 f"contiguous head dimension; got {tuple(c.shape)}")

    def args(self) -> tuple:
        """The kernels' rope arguments, after gemv's y (the q buffer)."""
        k, v = self.cache_k, self.cache_v
        return (self.cos, self.sin, self.slots, k, v, self.slots.shape[1], self.num_heads, self.num_kv_heads,
                self.cos.shape[-1] // 2, self.slots.stride(0), k.stride(0), k.stride(1), k.stride(2), v.stride(0),
                v.stride(1), v.stride(2))


def unused_args(x: torch.Tensor) -> tuple:
    """Placeholders for the rope arguments where the epilogue is not "rope" (never read)."""
    return (x, x, x, x, x, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0)


def unfused(y: torch.Tensor, epilogue: str, rope: RopeWrite | None) -> torch.Tensor:
    """The epilogue as its own kernel, after a projection that stored y [.., N] (cuBLAS configs): what the paired
    epilogue computes, and the numbers it must give."""
    from toolkit.infer.kernels.layer_ops import rope_cache_write, silu_mul

    if epilogue == "silu":
        return silu_mul(y)
    return rope_cache_write(y.contiguous(), rope.cos, rope.sin, rope.slots, rope.cache_k, rope.cache_v,
                            rope.num_heads, rope.num_kv_heads)


@triton.jit
def pair_rows(pid, N, D2, BLOCK_N: tl.constexpr, EPILOGUE: tl.constexpr):
    """The weight rows program `pid` owns: BLOCK_N in a run (EPILOGUE 0), else BLOCK_N / 2 pairs interleaved as
    lo, hi, lo, hi, ...: gate row j and up row j + N / 2 (1), or in head j // D2 its dimensions j % D2 and
    j % D2 + D2 (2). Rows past the pairs are N (out of range: masked)."""
    i = tl.arange(0, BLOCK_N)
    if EPILOGUE == 0:
        return pid * BLOCK_N + i
    j = pid * (BLOCK_N // 2) + i // 2
    hi = i % 2
    if EPILOGUE == 1:
        n = j + hi * (N // 2)
    else:
        n = (j // D2) * (2 * D2) + j % D2 + hi * D2
    return tl.where(j < N // 2, n, N)


@triton.jit
def store_pairs(y, m, m_ok, pid, y_ptr, sy, N, cos_ptr, sin_ptr, slot_ptr, k_ptr, v_ptr, T, HQ, HKV, D2, s_slot,
                skb, skh, sks, svb, svh, svs, BM: tl.constexpr, BLOCK_N: tl.constexpr, EPILOGUE: tl.constexpr):
    """y [BM, BLOCK_N]: the fp32 products of x's rows m [BM, 1] (m_ok: real rows) with pair_rows' rows (bias
    added). silu: y_ptr [rows, N / 2] (row stride sy) gets silu(gate) * up. rope: y_ptr [rows, HQ, D] gets q
    rotated, the cache gets k rotated and v at row m = b * T + t's slot."""
    dt = y_ptr.dtype.element_ty
    lo, hi = tl.split(tl.reshape(y, [BM, BLOCK_N // 2, 2]))                 # [BM, BLOCK_N / 2] each
    lo = lo.to(dt).to(tl.float32)  # the product rounded as the unfused kernel stores it, then read back
    hi = hi.to(dt).to(tl.float32)
    j = (pid * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2))[None, :]
    ok = m_ok & (j < N // 2)
    if EPILOGUE == 1:  # layer_ops._silu_mul_kernel: silu rounded like torch's, times up, rounded
        s = (lo / (1.0 + tl.exp(-lo))).to(dt).to(tl.float32)
        tl.store(y_ptr + m * sy + j, (s * hi).to(dt), mask=ok)
    else:  # layer_ops._rope_cache_kernel: x * cos + roll(x, D / 2) * sin, sin's first half negated
        head, d = j // D2, j % D2
        cs = cos_ptr + m * (2 * D2) + d
        sn = sin_ptr + m * (2 * D2) + d
        cos_lo = tl.load(cs, mask=ok, other=0.0).to(tl.float32)
        cos_hi = tl.load(cs + D2, mask=ok, other=0.0).to(tl.float32)
        sin_lo = tl.load(sn, mask=ok, other=0.0).to(tl.float32)
        sin_hi = tl.load(sn + D2, mask=ok, other=0.0).to(tl.float32)
        r_lo = lo * cos_lo + hi * sin_lo
        r_hi = hi * cos_hi + lo * sin_hi
        is_q = ok & (head < HQ)
        q = y_ptr + m * sy + head * (2 * D2) + d
        tl.store(q, r_lo.to(dt), mask=is_q)
        tl.store(q + D2, r_hi.to(dt), mask=is_q)
        b, t = (m // T).to(tl.int64), m % T                                       # int64: b * skb
        slot = tl.load(slot_ptr + b * s_slot + t, mask=m_ok, other=0)              # [BM, 1]
        is_k = ok & (head >= HQ) & (head < HQ + HKV)
        kp = k_ptr + b * skb + (head - HQ) * skh + slot * sks + d
        tl.store(kp, r_lo.to(k_ptr.dtype.element_ty), mask=is_k)
        tl.store(kp + D2, r_hi.to(k_ptr.dtype.element_ty), mask=is_k)
        is_v = ok & (head >= HQ + HKV)
        vp = v_ptr + b * svb + (head - HQ - HKV) * svh + slot * svs + d
        tl.store(vp, lo.to(v_ptr.dtype.element_ty), mask=is_v)
        tl.store(vp + D2, hi.to(v_ptr.dtype.element_ty), mask=is_v)
