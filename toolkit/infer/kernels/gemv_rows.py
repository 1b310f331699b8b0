"""The matrix-unit half of gemv (kernels/gemv.py): 2-16 rows of x times W on tl.dot (a verify step's tokens, a
batch's decode step, a tree's draft step), each W tile loaded once for all rows, with gemv's epilogues; and the
W-tile load both halves share. gemv picks the config and launches it; the torch reference is gemv's."""
from __future__ import annotations

import triton
import triton.language as tl

from toolkit.infer.kernels.epilogues import pair_rows, store_pairs
from toolkit.infer.kernels.pdl import wait_prior


@triton.jit
def _w_tile(w_ptr, n, n_ok, k, width, swn, swk, EVEN: tl.constexpr):
    """W[n, k] (columns past `width` as zeros unless EVEN: none are); the rows kernel reads x's rows with it too."""
    if EVEN:
        return tl.load(w_ptr + n[:, None] * swn + k[None, :] * swk, mask=n_ok[:, None], other=0.0)
    return tl.load(w_ptr + n[:, None] * swn + k[None, :] * swk, mask=n_ok[:, None] & (k < width)[None, :], other=0.0)


@triton.jit
def _rows_dot(acc, xk, w, UPCAST: tl.constexpr, SWAP: tl.constexpr):
    """acc + xk @ w^T on the matrix unit (acc [BLOCK_M, BLOCK_N]), or with SWAP acc^T + w @ xk^T (acc [BLOCK_N,
    BLOCK_M]): W's tile is then the MMA's A operand, whose 64+ rows Hopper's wgmma needs where x's 16 rows are too
    few. UPCAST: the interpreter's bf16 tl.dot is wrong, so fp32 operands (exact products of the same values);
    else the dtype's own (fp32: "ieee", no tf32)."""
    if UPCAST:
        xk, w = xk.to(tl.float32), w.to(tl.float32)
    if SWAP:
        acc += tl.dot(w, tl.trans(xk), input_precision="ieee")
    else:
        acc += tl.dot(xk, tl.trans(w), input_precision="ieee")
    return acc


@triton.jit
def _rows_x(x_ptr, nw_ptr, m, m_ok, k, K, sx, ss, NORM: tl.constexpr):
    """x's rows at columns k, a tile like W's ([BLOCK_M, BLOCK_K]), and the rows' running sums of squares. NORM:
    times the norm's weights nw[k], rounded to x's dtype; the 1 / RMS factor waits for the whole row."""
    xk = _w_tile(x_ptr, m, m_ok, k, K, sx, 1, False)
    if NORM:
        xf = xk.to(tl.float32)
        ss += tl.sum(xf * xf, 1)
        xk = (xf * tl.load(nw_ptr + k, mask=k < K, other=0.0).to(tl.float32)[None, :]).to(xk.dtype)
    return xk, ss


@triton.jit
def _rows_kernel(x_ptr, w_ptr, y_ptr, b_ptr, r_ptr, nw_ptr, M, N, K, eps, sx, swn, swk, sy, sr,
                 cos_ptr, sin_ptr, slot_ptr, k_ptr, v_ptr, T, HQ, HKV, D2, s_slot, skb, skh, sks, svb, svh, svs,
                 HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, UPCAST: tl.constexpr, NORM: tl.constexpr,
                 SWAP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 EPILOGUE: tl.constexpr, PDL: tl.constexpr):
    """Up to BLOCK_M (16) rows at once on the matrix unit (a verify step's 2-16 tokens, a batch's decode step):
    each W tile is loaded once for all rows, and the loads feed tl.dot, so Triton pipelines them. With PDL the
    first W tile is loaded before the wait, as _gemv_kernel's (kernels/pdl.py), and its product is the loop's
    first step, peeled: the same sums in the same order. SWAP ("dots" / "dotsn" configs): the products as
    W x^T, so that with 64+ rows of W a program Hopper runs them on wgmma from shared memory (a warp group's
    MMA needs 64 rows; x's 16 are too few), the pipeline's buffers there instead of registers. Prologues run
    before it as their own kernels ("dot"), except, in "dotn" / "dotsn" configs, the RMSNorm: RMSNorm(x) W^T =
    (1 / RMS(x)) * ((x * nw) W^T) row by row, so the statistic is summed from the x tiles the loop loads anyway
    and applied to the products at the end; no pass over x before the weights stream (an earlier fold of the
    prologues, the SiLU-mul's too, made the verify step 1.9x a decode step on an H100: RESULTS.md). It rounds
    x * nw once where norm.RMSNorm rounds twice."""
    n = pair_rows(tl.program_id(0), N, D2, BLOCK_N, EPILOGUE)
    m = tl.arange(0, BLOCK_M)
    n_ok, m_ok = n < N, m < M
    cols = tl.arange(0, BLOCK_K)
    w_first = _w_tile(w_ptr, n, n_ok, cols, K, swn, swk, False) if PDL else None
    wait_prior(PDL)
    if SWAP:
        acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    ss = tl.zeros([BLOCK_M], tl.float32)
    if PDL:
        xk, ss = _rows_x(x_ptr, nw_ptr, m, m_ok, cols, K, sx, ss, NORM)
        acc = _rows_dot(acc, xk, w_first, UPCAST, SWAP)
    for k0 in range(BLOCK_K if PDL else 0, K, BLOCK_K):
        k = k0 + cols
        xk, ss = _rows_x(x_ptr, nw_ptr, m, m_ok, k, K, sx, ss, NORM)
        acc = _rows_dot(acc, xk, _w_tile(w_ptr, n, n_ok, k, K, swn, swk, False), UPCAST, SWAP)
    if SWAP:
        y = tl.trans(acc)  # [BLOCK_M, BLOCK_N]
    else:
        y = acc
    if NORM:  # [BLOCK_M, BLOCK_N] * [BLOCK_M, 1]
        y = y * (1.0 / tl.sqrt(ss / K + eps))[:, None]
    if HAS_BIAS:
        y += tl.load(b_ptr + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if HAS_RESIDUAL:
        dt = y_ptr.dtype.element_ty
        y = y.to(dt).to(tl.float32) + tl.load(r_ptr + m[:, None] * sr + n[None, :],
                                              mask=m_ok[:, None] & n_ok[None, :], other=0.0).to(tl.float32)
    if EPILOGUE == 0:
        tl.store(y_ptr + m[:, None] * sy + n[None, :], y.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])
    else:
        store_pairs(y, m[:, None], m_ok[:, None], tl.program_id(0), y_ptr, sy, N, cos_ptr, sin_ptr, slot_ptr, k_ptr,
                    v_ptr, T, HQ, HKV, D2, s_slot, skb, skh, sks, svb, svh, svs, BLOCK_M, BLOCK_N, EPILOGUE)
