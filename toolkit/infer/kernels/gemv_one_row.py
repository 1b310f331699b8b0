"""The one-row half of gemv (kernels/gemv.py): one row of x times W as a GEMV (_gemv_kernel, kinds "ew" / "ew1"),
the layer's small steps folded in: a prologue on x (an RMSNorm, two RMSNorms over a concatenation, a
concatenation, SiLU-mul), the bias and residual adds, and gemv's epilogues (kernels/epilogues.py). Every program
owns BLOCK_N whole rows of W (no split-K reduction); a norm prologue recomputes the row's statistic per program.
gemv validates the arguments, picks the config and launches it; the torch reference is gemv's."""
from __future__ import annotations

import triton
import triton.language as tl

from toolkit.infer.kernels.epilogues import pair_rows, store_pairs
from toolkit.infer.kernels.gemv_rows import _w_tile
from toolkit.infer.kernels.pdl import wait_prior


@triton.jit
def _inv_rms(x_ptr, width, eps, BLOCK_K: tl.constexpr, STAT_BLOCK: tl.constexpr):
    """1 / RMS of x's `width` values: in one load of STAT_BLOCK values ("ew1"), else BLOCK_K values a load."""
    if STAT_BLOCK > 0:  # one L2 round trip before the weights stream
        sc = tl.arange(0, STAT_BLOCK)
        xs = tl.load(x_ptr + sc, mask=sc < width, other=0.0).to(tl.float32)
        ss = tl.sum(xs * xs, 0)
    else:
        cols = tl.arange(0, BLOCK_K)
        acc = tl.zeros([BLOCK_K], tl.float32)
        for k0 in range(0, width, BLOCK_K):
            xk = tl.load(x_ptr + k0 + cols, mask=(k0 + cols) < width, other=0.0).to(tl.float32)
            acc += xk * xk
        ss = tl.sum(acc, 0)
    return 1.0 / tl.sqrt(ss / width + eps)


@triton.jit
def _x_tile(x_ptr, nw_ptr, k, width, inv, PROLOGUE: tl.constexpr, EVEN: tl.constexpr):
    """x's values at columns k (of `width`) through a one-tensor prologue, in fp32: none (0), RMSNorm (1, x normed
    by inv and times nw, rounded as norm.RMSNorm rounds it, in x's dtype, which is y's) or SiLU-mul (2, x's
    second half the up values)."""
    dt = x_ptr.dtype.element_ty
    if EVEN:
        xk = tl.load(x_ptr + k).to(tl.float32)
    else:
        xk = tl.load(x_ptr + k, mask=k < width, other=0.0).to(tl.float32)
    if PROLOGUE == 1:  # normalised in fp32, rounded, then scaled and rounded (norm.RMSNorm)
        nw = tl.load(nw_ptr + k, mask=k < width, other=0.0).to(tl.float32)
        xk = (nw * (xk * inv).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    if PROLOGUE == 2:  # silu(gate) rounded like torch's silu, times up, rounded
        up = tl.load(x_ptr + width + k, mask=k < width, other=0.0).to(tl.float32)
        xk = ((xk / (1.0 + tl.exp(-xk))).to(dt).to(tl.float32) * up).to(dt).to(tl.float32)
    return xk


@triton.jit
def _part(acc, x_ptr, nw_ptr, w_ptr, col0, width, inv, n, n_ok, swn, swk, w_first, BLOCK_K: tl.constexpr,
          NORM: tl.constexpr, PEEL: tl.constexpr):
    """acc + W[n, col0:col0 + width] * x, x normed by inv and times nw with NORM. PEEL: the first tile's weights
    are w_first, loaded before the PDL wait (col0 is then 0)."""
    cols = tl.arange(0, BLOCK_K)
    if PEEL:
        acc += w_first.to(tl.float32) * _x_tile(x_ptr, nw_ptr, cols, width, inv, 1 if NORM else 0, False)[None, :]
    for k0 in range(BLOCK_K if PEEL else 0, width, BLOCK_K):
        k = k0 + cols
        w = _w_tile(w_ptr + col0 * swk, n, n_ok, k, width, swn, swk, False)
        acc += w.to(tl.float32) * _x_tile(x_ptr, nw_ptr, k, width, inv, 1 if NORM else 0, False)[None, :]
    return acc


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, y_ptr, nw_ptr, b_ptr, r_ptr, N, K, eps, swn, swk, x2_ptr, nw2_ptr, K1,
                 cos_ptr, sin_ptr, slot_ptr, k_ptr, v_ptr, T, HQ, HKV, D2, s_slot, skb, skh, sks, svb, svh, svs,
                 PROLOGUE: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                 EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAT_BLOCK: tl.constexpr,
                 EPILOGUE: tl.constexpr, PDL: tl.constexpr):
    n = pair_rows(tl.program_id(0), N, D2, BLOCK_N, EPILOGUE)   # BLOCK_N rows in a run, or paired (epilogues.py)
    n_ok = n < N
    cols = tl.arange(0, BLOCK_K)
    dt = y_ptr.dtype.element_ty
    # with PDL the first weight tile (x's first K1 columns' rows) is loaded before the wait: weights are never
    # written, and its DRAM round trip overlaps the kernel before's tail (kernels/pdl.py)
    w_first = _w_tile(w_ptr, n, n_ok, cols, K1, swn, swk, EVEN_K and PROLOGUE < 3) if PDL else None
    wait_prior(PDL)
    inv = 1.0
    if PROLOGUE == 1:  # the row's RMS statistic first: one pass over x (K values, in L2 after the first program)
        inv = _inv_rms(x_ptr, K, eps, BLOCK_K, STAT_BLOCK)
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    if PROLOGUE == 3:  # two statistics, then the concatenation's halves in two loops: x's K1 columns, x2's K - K1
        inv1 = _inv_rms(x_ptr, K1, eps, BLOCK_K, STAT_BLOCK)
        inv2 = _inv_rms(x2_ptr, K - K1, eps, BLOCK_K, STAT_BLOCK)
        acc = _part(acc, x_ptr, nw_ptr, w_ptr, 0, K1, inv1, n, n_ok, swn, swk, w_first, BLOCK_K, True, PDL)
        acc = _part(acc, x2_ptr, nw2_ptr, w_ptr, K1, K - K1, inv2, n, n_ok, swn, swk, None, BLOCK_K, True, False)
    elif PROLOGUE == 4:  # the concatenation's halves as they are: x's K1 columns, then x2's K - K1
        acc = _part(acc, x_ptr, nw_ptr, w_ptr, 0, K1, 1.0, n, n_ok, swn, swk, w_first, BLOCK_K, False, PDL)
        acc = _part(acc, x2_ptr, nw2_ptr, w_ptr, K1, K - K1, 1.0, n, n_ok, swn, swk, None, BLOCK_K, False, False)
    else:
        if PDL:
            acc += w_first.to(tl.float32) * _x_tile(x_ptr, nw_ptr, cols, K, inv, PROLOGUE, EVEN_K)[None, :]
        for k0 in range(BLOCK_K if PDL else 0, K, BLOCK_K):
            k = k0 + cols
            w = _w_tile(w_ptr, n, n_ok, k, K, swn, swk, EVEN_K)
            acc += w.to(tl.float32) * _x_tile(x_ptr, nw_ptr, k, K, inv, PROLOGUE, EVEN_K)[None, :]
    y = tl.sum(acc, 1)                                          # [BLOCK_N]
    if HAS_BIAS:
        y += tl.load(b_ptr + n, mask=n_ok, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:  # the product rounded, then added as torch adds two tensors of this dtype
        y = y.to(dt).to(tl.float32) + tl.load(r_ptr + n, mask=n_ok, other=0.0).to(tl.float32)
    if EPILOGUE == 0:
        tl.store(y_ptr + n, y.to(dt), mask=n_ok)
    else:  # one x row: m 0, y's row stride unused
        store_pairs(y[None, :], tl.zeros([1, 1], tl.int32), tl.full([1, 1], 1, tl.int1), tl.program_id(0), y_ptr, 0,
                    N, cos_ptr, sin_ptr, slot_ptr, k_ptr, v_ptr, T, HQ, HKV, D2, s_slot, skb, skh, sks, svb, svh, svs,
                    1, BLOCK_N, EPILOGUE)
