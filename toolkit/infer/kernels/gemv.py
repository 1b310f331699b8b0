"""Projections of steps of 1-16 tokens (decode, verify and draft steps) as Triton kernels beside their torch
reference: one row as a GEMV with the layer's small steps folded in (_gemv_kernel in kernels/gemv_one_row.py), 2-16
rows on the matrix unit (_rows_kernel in kernels/gemv_rows.py, its prologue run first as its own kernel, or an
RMSNorm folded in: "dotn" / "dotsn"). This module checks the arguments, picks each launch's config (gemv_config,
from gemv_configs.json) and launches one of them.

    y = epilogue(W @ prologue(x))        x one row [K] (or [2K] for silu), W [N, K] (any strides), y [N]
prologue:  none | "norm": RMSNorm(x) * norm_w, rounded as norm.RMSNorm rounds it
                | "norm2": cat[RMSNorm(x) * norm_w, RMSNorm(x2) * norm_w2], x [K1] and x2 [K - K1] two tensors,
                  each normed on its own (EAGLE-3's midlayer input: its two norms and the concatenation folded in)
                | "cat2": cat[x, x2], the same two tensors as they are (EAGLE-1/2's fc over [embedding, hidden])
                | "silu": silu(x[:K]) * x[K:], x being the fused gate/up GEMM's output (MLP's SiLU-mul)
epilogue:  + bias (fp32, before rounding), then + residual (after rounding, as torch's add rounds it)

Why: in a batch-1 decode step of an 8B model on an H100 the GEMMs stream the weights at 97% of the copy
bandwidth, but each layer also ran two RMSNorms, the SiLU-mul, the residual add and two cuBLAS split-K
reductions as separate kernels, ~11 us per layer (~0.35 ms per step, 6% of it: benchmarks/RESULTS.md). With
this kernel a layer is 7 kernels: qkv(norm) -> RoPE + cache write -> attention -> merge -> o(+ residual)
-> gate_up(norm) -> down(silu, + residual). Every program owns BLOCK_N whole rows of W, so there is no
split-K reduction; a norm prologue recomputes the row's statistic per program (K values from L2). With
programmatic dependent launch (kernels/pdl.py) a program loads its first weight tile before it waits for the
kernel before it, so that tile's DRAM round trip overlaps that kernel's tail.
On CPU it runs under TRITON_INTERPRET=1 (tests/infer/kernels/test_gemv.py).
"""
from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import torch
import triton

from toolkit.infer.kernels import shared_memory
from toolkit.infer.kernels.epilogues import EPILOGUES, RopeWrite, unfused, unused_args
from toolkit.infer.kernels.gemv_one_row import _gemv_kernel
from toolkit.infer.kernels.gemv_rows import _rows_kernel
from toolkit.infer.kernels.pdl import launch_kw

PROLOGUES = (None, "norm", "silu", "norm2", "cat2")
KINDS = ("ew", "ew1", "dot", "dotn", "dots", "dotsn", "torch")  # gemv_config's
ROWS_KINDS = ("dot", "dotn", "dots", "dotsn")  # _rows_kernel's


def reference_gemv(x, w, prologue=None, norm_w=None, eps: float = 1e-6, bias=None, residual=None, x2=None,
                   norm_w2=None):
    """The model's torch path for the same thing: rms_norm / silu_mul, F.linear, + residual."""
    from toolkit.infer.kernels.layer_ops import reference_rms_norm, reference_silu_mul

    if prologue == "norm2":
        x = torch.cat([reference_rms_norm(x, norm_w, eps), reference_rms_norm(x2, norm_w2, eps)], -1)
    if prologue == "cat2":
        x = torch.cat([x, x2], -1)
    if prologue == "norm":
        x = reference_rms_norm(x, norm_w, eps)
    elif prologue == "silu":
        x = reference_silu_mul(x)
    y = torch.nn.functional.linear(x, w, bias)
    return y if residual is None else residual + y


MAX_ROWS = 16  # more rows (a prefill) are a GEMM's job
MAX_STAT_BLOCK = 16384  # "ew1" loads a norm's whole row at once up to this width ("ew"'s blocked loop beyond)


@functools.lru_cache(maxsize=None)
def tuned_configs(device_name: str) -> dict:
    """gemv_configs.json beside this file: {device name: {"NxKxR": config, "pdl": bool}} (R: "1" row or "many"),
    written by benchmarks/bench_gemv.py --sweep --write-configs on that device ("pdl": kernels/pdl.py)."""
    path = Path(__file__).with_name("gemv_configs.json")
    return json.loads(path.read_text()).get(device_name, {}) if path.is_file() else {}


@functools.lru_cache(maxsize=None)
def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def gemv_config(n: int, k: int, rows: int = 1, device: torch.device | None = None) -> tuple:
    """(kind, BLOCK_N, BLOCK_K, num_warps, num_stages); kind "ew" (one row, element-wise products; "ew1" the
    same with a norm's statistic from one load of the row instead of BLOCK_K values a load), "dot"
    (_rows_kernel; "dotn" the same with a norm prologue folded in; "dots" / "dotsn" those with W as the MMA's
    first operand) or "torch" (cuBLAS after the prologue's kernel): the device's tuned entry for this shape if
    there is one, else a rule from an H100 sweep."""
    hit = tuned_configs(_device_name(device or torch.device("cpu"))).get(f"{n}x{k}x{1 if rows == 1 else 'many'}")
    if hit:
        return tuple(hit)
    if rows > 1:  # wide tiles for wide outputs, narrow ones where N / BLOCK_N programs would be too few
        return "dot", (64 if n >= 16384 else 16), 256, 4, 4
    if n * k <= 32 * 2 ** 20:  # few rows' worth of bytes: one row per program keeps every SM busy
        return "ew", 1, 512, 4, 1
    return "ew", (2 if k > 8192 else 8), 512, 4, 1


def gemv(x: torch.Tensor, w: torch.Tensor, prologue: str | None = None, norm_w: torch.Tensor | None = None,
         eps: float = 1e-6, bias: torch.Tensor | None = None, residual: torch.Tensor | None = None,
         config: tuple | None = None, x2: torch.Tensor | None = None, norm_w2: torch.Tensor | None = None,
         epilogue: str | None = None, rope: RopeWrite | None = None) -> torch.Tensor:
    """x [..., K] holding 1..MAX_ROWS rows ([..., 2K] for silu; [..., K1] beside x2 [..., K - K1] for norm2 and
    cat2), w [N, K] -> y [..., N]; residual [..., N]. w must be a weight, which no kernel writes: with PDL its
    first tile is read before the wait for the kernel before (kernels/pdl.py). epilogue (kernels/epilogues.py):
    "silu" -> silu(y[..., :N/2]) * y[..., N/2:]; "rope" (x [B, T, K], rope's tables, slots and cache) -> q
    [B, Hq, T, D] rotated, k rotated and v written into the cache; neither with a residual."""
    if prologue not in PROLOGUES:
        raise ValueError(f"prologue {prologue!r}; accepted: {PROLOGUES}")
    if epilogue not in EPILOGUES:
        raise ValueError(f"epilogue {epilogue!r}; accepted: {EPILOGUES}")
    N, K = w.shape
    if epilogue is not None and residual is not None:
        raise ValueError(f"a {epilogue} epilogue takes no residual")
    if epilogue == "silu" and N % 2:
        raise ValueError(f"a silu epilogue needs an even number of output rows (gate; up); the weight has {N}")
    if epilogue == "rope":
        if not isinstance(rope, RopeWrite):
            raise ValueError("a rope epilogue needs rope=RopeWrite(cos, sin, slots, cache_k, cache_v, Hq, Hkv)")
        rope.check(tuple(x.shape[:-1]), N)
    K1 = K
    if prologue in ("norm2", "cat2"):
        if x2 is None or x2.shape[:-1] != x.shape[:-1] or x.shape[-1] + x2.shape[-1] != K:
            raise ValueError(f"a {prologue} prologue needs x2 with x's rows and {K} - x's width values; got x "
                             f"{tuple(x.shape)}, x2 {None if x2 is None else tuple(x2.shape)}")
        K1 = x.shape[-1]
    if prologue == "norm2":
        if norm_w is None or norm_w2 is None or norm_w.shape != (K1,) or norm_w2.shape != (K - K1,):
            raise ValueError(f"a norm2 prologue needs norm_w of shape ({K1},) and norm_w2 of shape ({K - K1},)")
    width = 2 * K if prologue == "silu" else K1
    rows = x.numel() // max(width, 1)
    if x.shape[-1] != width or not 1 <= rows <= MAX_ROWS:
        raise ValueError(f"gemv takes 1..{MAX_ROWS} rows of {width} values; got x of shape {tuple(x.shape)}")
    if prologue == "norm" and (norm_w is None or norm_w.shape != (K,)):
        raise ValueError(f"a norm prologue needs norm_w of shape ({K},)")
    kind, block_n, block_k, warps, stages = config or gemv_config(N, K, rows, x.device)
    if kind not in KINDS:
        raise ValueError(f"GEMV config kind {kind!r}; accepted: {KINDS}")
    fold_norm = kind in ("dotn", "dotsn") and prologue == "norm"  # else the norm is its own kernel, as for "dot"
    launch = launch_kw(x.device, rows)
    if kind in ROWS_KINDS:  # the deepest pipeline, then the longest K tile, that fits the device's shared memory
        flags = (shared_memory.async_copies(x.device),
                 kind in ("dots", "dotsn") and shared_memory.operands_in_shared(x.device), fold_norm, launch["PDL"])
        stages, block_k = shared_memory.rows_tile(MAX_ROWS, block_n, block_k, stages, w.element_size(), flags,
                                                  shared_memory.max_shared(x.device))
    if epilogue is not None and kind == "torch":  # cuBLAS stores the product; the epilogue's own kernel follows
        return unfused(gemv(x, w, prologue, norm_w, eps, bias, None, config, x2, norm_w2), epilogue, rope)
    lead = x.shape[:-1]
    x = x.reshape(rows, width)
    if x.stride(-1) != 1:
        x = x.contiguous()
    if prologue in ("norm2", "cat2"):
        x2 = x2.reshape(rows, K - K1)
        x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
    # the output: y [rows, N]; silu's [rows, N / 2]; rope's q [rows, Hq, D] (as [B, T, Hq, D])
    out_n = N if epilogue is None else N // 2 if epilogue == "silu" else rope.num_heads * rope.cos.shape[-1]
    y = torch.empty(rows, out_n, dtype=x.dtype, device=x.device)
    r = y
    if residual is not None:
        if residual.numel() != rows * N:
            raise ValueError(f"residual holds {residual.numel()} values, the product {rows * N}")
        r = residual.reshape(rows, N)
        if r.stride(-1) != 1:
            r = r.contiguous()
    ep = EPILOGUES.index(epilogue)
    ep_args = rope.args() if epilogue == "rope" else unused_args(x)
    if ep:  # a program owns BLOCK_N / 2 pairs of rows (at least one)
        block_n = max(block_n, 2)
    grid = (triton.cdiv(N, max(block_n, 1)),)  # (block_n is 0 for "torch")

    def shaped(y):
        if epilogue == "rope":
            B, T = lead
            return y.view(B, T, rope.num_heads, -1).transpose(1, 2)
        return y.view(*lead, out_n)

    if kind in ("ew", "ew1") and rows == 1:
        stat_block = triton.next_power_of_2(max(K1, K - K1)) if kind == "ew1" and prologue in ("norm", "norm2") else 0
        stat_block = stat_block if stat_block <= MAX_STAT_BLOCK else 0  # too wide for one load: the blocked loop
        _gemv_kernel[grid](
            x, w, y, norm_w if norm_w is not None else x, bias if bias is not None else x, r, N, K, eps,
            w.stride(0), w.stride(1), x2 if x2 is not None else x, norm_w2 if norm_w2 is not None else x, K1,
            *ep_args, PROLOGUE=PROLOGUES.index(prologue), HAS_BIAS=bias is not None,
            HAS_RESIDUAL=residual is not None, EVEN_K=K % block_k == 0, BLOCK_N=block_n, BLOCK_K=block_k,
            STAT_BLOCK=stat_block, EPILOGUE=ep, num_warps=warps, num_stages=stages, **launch)
        return shaped(y)
    from toolkit.infer.kernels.layer_ops import rms_norm, rms_norm_pair, silu_mul

    if prologue == "norm2":  # both norms and the concatenation as one kernel
        x = rms_norm_pair(x, norm_w, x2, norm_w2, eps)
    if prologue == "cat2":
        x = torch.cat([x, x2], -1)
    x = rms_norm(x, norm_w, eps) if prologue == "norm" and not fold_norm else silu_mul(x) if prologue == "silu" else x
    if kind == "torch":  # the separate kernels (cuBLAS), where the sweep found them faster for this shape
        y = torch.nn.functional.linear(x, w, bias)
        return (y if residual is None else r + y).view(*lead, N)
    _rows_kernel[grid](
        x, w, y, bias if bias is not None else x, r, norm_w if fold_norm else x, rows, N, K, eps, x.stride(0),
        w.stride(0), w.stride(1), y.stride(0), r.stride(0), *ep_args, HAS_BIAS=bias is not None,
        HAS_RESIDUAL=residual is not None, UPCAST=os.environ.get("TRITON_INTERPRET") == "1", NORM=fold_norm,
        SWAP=kind in ("dots", "dotsn"), BLOCK_M=MAX_ROWS, BLOCK_N=block_n, BLOCK_K=block_k, EPILOGUE=ep,
        num_warps=warps, num_stages=stages, **launch)
    return shaped(y)
