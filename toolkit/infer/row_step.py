"""A decoder layer for a step of at most 16 tokens on the Triton kernels (a batch-1 decode step, a verify or a
draft step): its projections run as kernels/gemv.py's GEMVs with the layer's small steps folded in (the norms
as prologues, SiLU-mul as a prologue, the residual adds as epilogues), 6 kernels where Block.forward runs 13;
with kernels/epilogues.py on, RoPE + cache write and SiLU-mul are the epilogues of the q/k/v and gate/up
projections: a decode step's layer loses its RoPE kernel, a verify step's its RoPE and SiLU-mul kernels.
model.Block and the draft heads' first layer call it when row_step_ok says the layer qualifies.
Shapes: B batch, T tokens (B * T <= 16), H hidden, D head dim, Hq/Hkv query/key-value heads, I intermediate.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from toolkit.infer.kv_cache import KVCache

if TYPE_CHECKING:
    from toolkit.infer.attention import Attention
    from toolkit.infer.model import MLP
    from toolkit.infer.norm import RMSNorm


def few_rows(x: torch.Tensor, kernels: str) -> bool:
    """A step of at most 16 tokens in all (a decode step of up to 16 sequences, a verify or draft step) on the
    Triton kernels: kernels/gemv.py runs its projections, with the small steps folded in."""
    from toolkit.infer.kernels.gemv import MAX_ROWS

    return kernels == "triton" and x.shape[0] * x.shape[1] <= MAX_ROWS


def row_step_ok(attn: nn.Module, mlp: nn.Module, x: torch.Tensor, cache: KVCache | None, slots) -> bool:
    """True when row_step can run the layer: few_rows, and a Llama-family layer over a cache with fused
    projections (an MLP with gate_up, an Attention whose RoPE + cache write fuse). a MoE MLP and DeepSeek's MLA
    modules have neither attribute and run their own forward."""
    return getattr(mlp, "gate_up", None) is not None and few_rows(x, mlp.kernels) \
        and hasattr(attn, "fused_rope_ok") and attn.fused_rope_ok(cache, slots)


def row_step(attn: "Attention", mlp: "MLP", post_norm: RMSNorm, qkv_in: dict, h, cos, sin, mask, cache: KVCache,
             layer: int, slots, kv_len: int) -> torch.Tensor:
    """A decoder layer for a few rows as 6 kernels (kernels/gemv.py folds the norms, SiLU-mul and residual adds
    into the GEMVs): qkv_in the q/k/v GEMV's input as gemv keywords (x [B, T, *], and its prologue: the layer's
    input norm, or EAGLE-3's two norms of emb and hidden), h [B, T, H] the residual. Returns the layer's output
    h [B, T, H]: Block.forward's numbers up to the summation order."""
    from toolkit.infer.kernels import epilogues
    from toolkit.infer.kernels.gemv import gemv

    if epilogues.enabled(h.device):  # RoPE + cache write and SiLU-mul in the projections before them: 4 kernels
        c = attn.c
        rope = epilogues.RopeWrite(cos, sin, slots, cache.k[layer], cache.v[layer], c.num_heads, c.num_kv_heads)
        q = gemv(w=attn.qkv, bias=attn.qkv_b, epilogue="rope", rope=rope, **qkv_in)  # [B, Hq, T, D]
        a = attn.attend_rotated(q, mask, cache, layer, kv_len)                     # [B, T, Hq D]
        h = gemv(a, attn.o_proj.weight, bias=attn.o_proj.bias, residual=h)         # h + o_proj(a)
        act = gemv(h, mlp.gate_up, "norm", post_norm.weight, post_norm.eps, epilogue="silu")  # [B, T, I]
        return gemv(act, mlp.down_proj.weight, residual=h)                         # h + down(silu(g) * u)
    qkv = gemv(w=attn.qkv, bias=attn.qkv_b, **qkv_in)                            # [B, T, (Hq + 2 Hkv) D]
    a = attn.attend_qkv(qkv, cos, sin, mask, cache, layer, slots, kv_len)          # [B, T, Hq D]
    h = gemv(a, attn.o_proj.weight, bias=attn.o_proj.bias, residual=h)             # h + o_proj(a)
    gate_up = gemv(h, mlp.gate_up, "norm", post_norm.weight, post_norm.eps)        # [B, T, 2I]
    return gemv(gate_up, mlp.down_proj.weight, "silu", residual=h)                 # h + down(silu(g) * u)
