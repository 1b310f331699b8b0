"""The decoder layer's small element-wise steps fused into single Triton kernels, beside their torch references.

A batch-1 decode step of an 8B model is ~30 GEMVs plus ~35 small kernels per layer (norm: 7, RoPE: 8, cache
write: 4, SiLU-mul: 2, ...); inside a CUDA graph each small kernel still costs a few microseconds, ~2.5 ms per
step on an H100 against a 5.3 ms weight-streaming floor (benchmarks/RESULTS.md). Here they are 4 per layer:
  rms_norm(x, w)                  RMSNorm, computed as transformers does (fp32 statistics, rounded, scaled)
  rms_norm_pair(x, w, x2, w2)     cat[rms_norm(x, w), rms_norm(x2, w2)] (EAGLE-3's midlayer input)
  add_rms_norm(x, residual, w)    h = residual + x (rounded like torch's add), then RMSNorm(h): (h, normed)
  silu_mul(gate_up)               silu(gate) * up over the fused gate/up GEMM's output [.., 2I] -> [.., I]
  rope_cache_write(qkv, ...)      RoPE on q and k from the fused q/k/v GEMM's output, k and v written into
                                  the KV cache at their slots, q returned [B, Hq, T, D]
  rope_cos_sin(positions, ...)    the step's cos / sin tables (attention.rope_cos_sin's 9 kernels as one)
On CPU they run under TRITON_INTERPRET=1 (tests/infer/kernels/test_layer_ops.py). Steps of at most 16 tokens
go further: kernels/gemv.py folds the norms, SiLU-mul and residual adds into the projections themselves.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from toolkit.infer.kernels.pdl import launch_kw, wait_prior


def reference_rms_norm(x, w, eps, residual=None, fp32_product=False, offset=0.0):
    """What the model's torch path computes: (normed) or (h, normed) with h = residual + x; offset 1: scaled by
    (1 + w) in fp32 (Gemma's; with fp32_product)."""
    h = x if residual is None else residual + x
    f = h.float()
    f = f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + eps)
    y = ((offset + w.float()) * f).to(h.dtype) if fp32_product else w * f.to(h.dtype)
    return y if residual is None else (h, y)


@triton.jit
def _rms_norm_kernel(x_ptr, r_ptr, w_ptr, y_ptr, h_ptr, N, eps, sx, sr, sy, sh,
                     HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
                     FP32_PRODUCT: tl.constexpr = False, offset=0.0):
    wait_prior(PDL)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    x = tl.load(x_ptr + row * sx + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        x = x + tl.load(r_ptr + row * sr + cols, mask=ok, other=0.0).to(tl.float32)
        x = x.to(h_ptr.dtype.element_ty)                       # the sum rounded as torch's add rounds it
        tl.store(h_ptr + row * sh + cols, x, mask=ok)
        x = x.to(tl.float32)
    _norm_row(x, w_ptr, y_ptr + row * sy, cols, ok, N, eps, FP32_PRODUCT, offset)


@triton.jit
def _norm_row(x, w_ptr, y_ptr, cols, ok, N, eps, FP32_PRODUCT: tl.constexpr = False, offset=0.0):
    """x: one row's N values in fp32 (zeros past them) -> RMSNorm(x) * w at y_ptr (normalised in fp32, rounded,
    then scaled, as transformers computes it; FP32_PRODUCT: scaled in fp32, then rounded, as GPT-OSS's; by
    (offset + w) there, Gemma's (1 + w))."""
    inv = 1.0 / tl.sqrt(tl.sum(x * x, 0) / N + eps)
    y = x * inv
    if not FP32_PRODUCT:
        y = y.to(y_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32) + offset
    tl.store(y_ptr + cols, (w * y).to(y_ptr.dtype.element_ty), mask=ok)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
             out: torch.Tensor | None = None, fp32_product: bool = False, offset: float = 0.0):
    """x (and residual) [..., N] -> normed, or (residual + x, normed) with a residual. out: where the normed rows
    go (shaped like x, last dimension contiguous; e.g. one half of a concatenation, so no cat kernel follows).
    fp32_product: GPT-OSS's rounding (the weight's product in fp32, then rounded); offset 1 with it: scaled by
    (1 + w), Gemma's."""
    if offset and not fp32_product:
        raise ValueError("rms_norm's offset (Gemma's 1 + w) is computed in fp32: it needs fp32_product=True")
    N = x.shape[-1]
    x2 = x.reshape(-1, N)
    if out is not None and (out.shape != x.shape or out.stride(-1) != 1):
        raise ValueError("rms_norm's out must be shaped like x with a contiguous last dimension")
    y = torch.empty_like(x2) if out is None else out.view(-1, N)
    r2 = h = x2
    if residual is not None:
        r2, h = residual.reshape(-1, N), torch.empty_like(x2)
    if x2.stride(-1) != 1 or r2.stride(-1) != 1:
        raise ValueError("rms_norm needs a contiguous last dimension")
    _rms_norm_kernel[(x2.shape[0],)](x2, r2, w, y, h, N, eps, x2.stride(0), r2.stride(0), y.stride(0), h.stride(0),
                                     HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(N),
                                     FP32_PRODUCT=fp32_product, offset=float(offset),
                                     **launch_kw(x.device, x2.shape[0]))
    y = y.view(x.shape) if out is None else out
    return y if residual is None else (h.view(x.shape), y)


@triton.jit
def _rms_norm_pair_kernel(x_ptr, x2_ptr, w_ptr, w2_ptr, y_ptr, N1, N2, eps, eps2, sx, sx2, sy, BLOCK: tl.constexpr,
                          PDL: tl.constexpr):
    wait_prior(PDL)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    if tl.program_id(1) == 0:                                  # x into columns [0, N1) of y's row
        ok = cols < N1
        x = tl.load(x_ptr + row * sx + cols, mask=ok, other=0.0).to(tl.float32)
        _norm_row(x, w_ptr, y_ptr + row * sy, cols, ok, N1, eps)
    else:                                                      # x2 into columns [N1, N1 + N2)
        ok = cols < N2
        x = tl.load(x2_ptr + row * sx2 + cols, mask=ok, other=0.0).to(tl.float32)
        _norm_row(x, w2_ptr, y_ptr + row * sy + N1, cols, ok, N2, eps2)


def rms_norm_pair(x: torch.Tensor, w: torch.Tensor, x2: torch.Tensor, w2: torch.Tensor, eps: float,
                  eps2: float | None = None) -> torch.Tensor:
    """cat[RMSNorm(x) * w, RMSNorm(x2) * w2] as one kernel (EAGLE-3's midlayer input: two norms and the
    concatenation; two rms_norm launches before): x [..., N1] and x2 [..., N2] with the same leading shape and
    contiguous rows -> [..., N1 + N2]."""
    N1, N2 = x.shape[-1], x2.shape[-1]
    if x.shape[:-1] != x2.shape[:-1] or w.shape != (N1,) or w2.shape != (N2,):
        raise ValueError(f"rms_norm_pair: x {tuple(x.shape)} and x2 {tuple(x2.shape)} need the same leading shape, "
                         f"w ({N1},) and w2 ({N2},); got w {tuple(w.shape)}, w2 {tuple(w2.shape)}")
    a, b = x.reshape(-1, N1), x2.reshape(-1, N2)
    if a.stride(-1) != 1 or b.stride(-1) != 1:
        raise ValueError("rms_norm_pair needs contiguous last dimensions")
    y = torch.empty(a.shape[0], N1 + N2, dtype=x.dtype, device=x.device)
    _rms_norm_pair_kernel[(a.shape[0], 2)](a, b, w, w2, y, N1, N2, eps, eps if eps2 is None else eps2, a.stride(0),
                                           b.stride(0), y.stride(0), BLOCK=triton.next_power_of_2(max(N1, N2)),
                                           **launch_kw(x.device, a.shape[0]))
    return y.view(*x.shape[:-1], N1 + N2)


def reference_silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, I, s_gu, s_out, BLOCK: tl.constexpr, PDL: tl.constexpr):
    wait_prior(PDL)
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < I
    g = tl.load(gu_ptr + row * s_gu + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * s_gu + I + cols, mask=ok, other=0.0).to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(out_ptr.dtype.element_ty).to(tl.float32)  # rounded like torch's silu
    tl.store(out_ptr + row * s_out + cols, (s * u).to(out_ptr.dtype.element_ty), mask=ok)


def silu_mul(gate_up: torch.Tensor, block: int = 1024) -> torch.Tensor:
    I2 = gate_up.shape[-1]
    gu = gate_up.reshape(-1, I2)
    if gu.stride(-1) != 1:
        raise ValueError("silu_mul needs a contiguous last dimension")
    out = torch.empty(gu.shape[0], I2 // 2, dtype=gu.dtype, device=gu.device)
    _silu_mul_kernel[(gu.shape[0], triton.cdiv(I2 // 2, block))](gu, out, I2 // 2, gu.stride(0), out.stride(0),
                                                                 BLOCK=block, **launch_kw(gu.device, gu.shape[0]))
    return out.view(*gate_up.shape[:-1], I2 // 2)


def reference_rope_cache_write(qkv, cos, sin, slots, cache_k, cache_v, num_heads: int, num_kv_heads: int):
    """The torch path: split, rotate (x * cos + roll(x) * sin with sin's first half negated), write k/v."""
    B, T, _ = qkv.shape
    D = cos.shape[-1]
    q, k, v = qkv.split([num_heads * D, num_kv_heads * D, num_kv_heads * D], -1)
    q = q.view(B, T, num_heads, D).transpose(1, 2)
    k = k.view(B, T, num_kv_heads, D).transpose(1, 2)
    q, k = (x * cos + x.roll(D // 2, dims=-1) * sin for x in (q, k))
    rows = torch.arange(B, device=qkv.device)[:, None]
    cache_k[rows, :, slots] = k.transpose(1, 2).to(cache_k.dtype)
    cache_v[rows, :, slots] = v.view(B, T, num_kv_heads, D).to(cache_v.dtype)
    return q


@triton.jit
def _rope_cache_kernel(qkv_ptr, cos_ptr, sin_ptr, slot_ptr, q_ptr, k_ptr, v_ptr, T, HQ, HKV, D,
                       s_qkv, s_slot, skb, skh, sks, svb, svh, svs, BLOCK_D: tl.constexpr,
                       PDL: tl.constexpr):
    wait_prior(PDL)
    row = tl.program_id(0)                                     # b * T + t
    head = tl.program_id(1)                                    # q heads, then kv heads
    b, t = (row // T).to(tl.int64), row % T                    # int64: b * skb may pass 2**31
    d = tl.arange(0, BLOCK_D)
    ok = d < D
    rot = (d + D // 2) % D                                     # roll by D / 2
    cos = tl.load(cos_ptr + row * D + d, mask=ok, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + row * D + d, mask=ok, other=0.0).to(tl.float32)
    src = qkv_ptr + row * s_qkv + head * D
    x = tl.load(src + d, mask=ok, other=0.0).to(tl.float32)
    y = x * cos + tl.load(src + rot, mask=ok, other=0.0).to(tl.float32) * sin
    if head < HQ:
        tl.store(q_ptr + (row * HQ + head) * D + d, y.to(q_ptr.dtype.element_ty), mask=ok)
    else:
        kh = head - HQ
        slot = tl.load(slot_ptr + b * s_slot + t)
        tl.store(k_ptr + b * skb + kh * skh + slot * sks + d, y.to(k_ptr.dtype.element_ty), mask=ok)
        v = tl.load(src + HKV * D + d, mask=ok, other=0.0)
        tl.store(v_ptr + b * svb + kh * svh + slot * svs + d, v.to(v_ptr.dtype.element_ty), mask=ok)


def rope_cache_write(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor,
                     cache_k: torch.Tensor, cache_v: torch.Tensor, num_heads: int, num_kv_heads: int) -> torch.Tensor:
    """qkv [B, T, (Hq + 2 Hkv) D] (contiguous), cos/sin [B, 1, T, D] (contiguous; attention.rope_cos_sin), slots
    [B, T]; cache_k/v [>= B, Hkv, S, D] (one layer, head dim contiguous) -> rotated q [B, Hq, T, D]."""
    B, T, _ = qkv.shape
    D = cos.shape[-1]
    if not (qkv.is_contiguous() and cos.is_contiguous() and sin.is_contiguous()):
        raise ValueError("rope_cache_write needs contiguous qkv / cos / sin")
    if cache_k.stride(-1) != 1 or cache_v.stride(-1) != 1:
        raise ValueError("the KV cache needs a contiguous head dimension")
    q = torch.empty(B, T, num_heads, D, dtype=qkv.dtype, device=qkv.device)
    slots = slots.contiguous()  # a no-op for the engine's slots
    _rope_cache_kernel[(B * T, num_heads + num_kv_heads)](
        qkv, cos, sin, slots, q, cache_k, cache_v, T, num_heads, num_kv_heads, D, qkv.stride(1), slots.stride(0),
        cache_k.stride(0), cache_k.stride(1), cache_k.stride(2), cache_v.stride(0), cache_v.stride(1),
        cache_v.stride(2), BLOCK_D=triton.next_power_of_2(D), **launch_kw(qkv.device, B * T))
    return q.transpose(1, 2)


@triton.jit
def _cos_sin_kernel(pos_ptr, inv_ptr, cos_ptr, sin_ptr, factor, HALF: tl.constexpr, BLOCK: tl.constexpr,
                    PDL: tl.constexpr):
    wait_prior(PDL)
    row = tl.program_id(0)                                     # b * T + t
    d = tl.arange(0, BLOCK)
    ok = d < 2 * HALF
    first = d < HALF
    angle = tl.load(pos_ptr + row).to(tl.float32) * tl.load(inv_ptr + d % HALF, mask=ok, other=0.0)
    sin = tl.sin(angle)
    tl.store(cos_ptr + row * 2 * HALF + d, (tl.cos(angle) * factor).to(cos_ptr.dtype.element_ty), mask=ok)
    tl.store(sin_ptr + row * 2 * HALF + d, (tl.where(first, -sin, sin) * factor).to(sin_ptr.dtype.element_ty),
             mask=ok)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, dtype, factor: float = 1.0):
    """attention.rope_cos_sin in one kernel: positions [B, T] -> cos, sin [B, 1, T, D] (sin's first half negated)."""
    B, T = positions.shape
    half = inv_freq.shape[0]
    cos = torch.empty(B, 1, T, 2 * half, dtype=dtype, device=positions.device)
    sin = torch.empty_like(cos)
    _cos_sin_kernel[(B * T,)](positions.contiguous(), inv_freq, cos, sin, factor, HALF=half,
                              BLOCK=triton.next_power_of_2(2 * half), **launch_kw(positions.device, B * T))
    return cos, sin
