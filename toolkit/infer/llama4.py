"""Llama 4's attention and MoE MLP, as transformers' Llama4TextAttention / Llama4TextMoe compute them (what each
setting means: llama4_config.py); the decoder layer is model.py's Block. n tokens, H hidden, I per expert, E experts,
k chosen per token; B batch, T tokens, S cache slots, Hq / Hkv heads, D head dim.

    top, ids = topk(x @ router.weight.T, k); s = sigmoid(top)     # [n, k]
    out = shared_expert(x) + sum over the k of expert_e(x * s)    # the score scales the expert's input
    expert_e(y) = (up * silu(gate)) @ down_proj[e],  gate | up = y @ gate_up_proj[e] (halves of [E, H, 2I])

Checkpoint names are transformers' (feed_forward.router, feed_forward.experts.{gate_up_proj, down_proj},
feed_forward.shared_expert.*; `feed_forward` read as `mlp`, hf_names.py). The experts hit are read on the host: a
Llama 4 target with MoE layers runs eagerly.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from toolkit.infer.attention import Attention, rotate
from toolkit.infer.config import ModelConfig
from toolkit.infer.kv_cache import KVCache
from toolkit.infer.llama4_config import Llama4


class Llama4Attention(Attention):
    def __init__(self, c: ModelConfig, layer: int):
        super().__init__(c)
        self.rope = layer not in c.llama4.nope_layers
        self.l2 = c.llama4.qk_l2_norm and self.rope

    def fused_rope_ok(self, cache: KVCache | None, slots) -> bool:
        """Never: Llama 4's RoPE (float32, NoPE layers, L2 norms) is _project's, so the Triton path keeps that and
        the tree-attention kernel, not the fused RoPE + cache write (nor row_step, which needs it)."""
        return False

    def _project(self, x, cos, sin, cache: KVCache | None, layer: int, slots, kv_len: int):
        """Attention's, with Llama 4's steps: on a RoPE layer q and k L2-normed after RoPE; a NoPE layer is given
        (None, its queries' temperature scales [B, 1, T, 1] or None) for (cos, sin) (Transformer.forward)."""
        B, T, _ = x.shape
        c = self.c
        q, k, v = self.qkv_proj(x)
        q = q.view(B, T, c.num_heads, c.head_dim).transpose(1, 2)                  # [B, Hq, T, D]
        k = k.view(B, T, c.num_kv_heads, c.head_dim).transpose(1, 2)               # [B, Hkv, T, D]
        v = v.view(B, T, c.num_kv_heads, c.head_dim).transpose(1, 2)
        if self.rope:
            q, k = (rotate(t.float(), cos, sin).to(t.dtype) for t in (q, k))  # fp32 cos / sin: one rounding
            if self.l2:  # transformers' Llama4TextL2Norm: RMS in fp32, no weight
                q, k = (F.rms_norm(t.float(), (c.head_dim,), eps=c.rms_norm_eps).to(t.dtype) for t in (q, k))
        elif sin is not None:
            q = (q * sin).to(q.dtype)
        if cache is not None:
            cache.write(layer, k, v, slots)
            k, v = cache.k[layer, :B, :, :kv_len], cache.v[layer, :B, :, :kv_len]
        return q, k, v


class Llama4MoE(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        from toolkit.infer.model import MLP

        E, H, inner = c.moe.num_experts, c.hidden_size, c.moe.intermediate_size
        self.top_k = c.moe.top_k
        self.router = nn.Linear(H, E, bias=False)
        self.experts = nn.Module()
        self.experts.gate_up_proj = nn.Parameter(torch.zeros(E, H, 2 * inner))   # columns: gate, then up
        self.experts.down_proj = nn.Parameter(torch.zeros(E, inner, H))
        self.shared_expert = MLP(c, c.moe.shared_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape, flat = x.shape, x.reshape(-1, x.shape[-1])                           # [n, H]
        top, ids = self.router(flat).topk(self.top_k, dim=-1)                       # [n, k]
        scores = torch.sigmoid(top.float()).to(flat.dtype)
        out = self.shared_expert(flat)
        for e in ids.unique().tolist():
            rows, slot = (ids == e).nonzero(as_tuple=True)
            gate, up = (flat[rows] * scores[rows, slot, None] @ self.experts.gate_up_proj[e]).chunk(2, dim=-1)
            out.index_add_(0, rows, (up * F.silu(gate)) @ self.experts.down_proj[e])
        return out.view(shape)


def temperature(positions: torch.Tensor, l4: Llama4) -> torch.Tensor | None:
    """NoPE layers' query scales [B, 1, T, 1] float32 for positions [B, T] (None without temperature tuning)."""
    if l4.floor_scale is None:
        return None
    scale = torch.log1p(torch.floor((positions.float() + 1.0) / l4.floor_scale)) * l4.attn_scale + 1.0
    return scale[:, None, :, None]


def same_chunk(positions: torch.Tensor, slots: torch.Tensor | None, kv_len: int, chunk: int) -> torch.Tensor:
    """bool [B, T, S]: whether each query (positions [B, T]) and key share a chunk of `chunk` positions. A key's
    position is its slot's, but for this step's tokens (slots [B, T]; a tree's nodes sit past their positions);
    without a cache (slots None) the keys are the T tokens themselves."""
    if slots is None:
        keys = positions
    else:
        keys = torch.arange(kv_len, device=positions.device).expand(len(positions), kv_len).clone()
        keys.scatter_(1, slots, positions)
    return (positions[:, :, None] // chunk) == (keys[:, None, :] // chunk)
