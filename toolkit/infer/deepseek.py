"""DeepSeek-V3 blocks for the engine: multi-head latent attention (MLA) and the mixture-of-experts MLP.
toolkit/infer/model.py picks them for `model_type: deepseek_v3` (Block), so a DeepSeek target, and the NextN
MTP layers it ships (toolkit/infer/mtp.py), run in the same engine as the Llama family.

MLA (B batch, T tokens, Hq heads, N = qk_nope_head_dim, R = qk_rope_head_dim, Dv = v_head_dim):
    q = q_b_proj(q_a_layernorm(q_a_proj(x)))  (or q_proj(x))             # [B, T, Hq, N + R]
    c, k_rot = split(kv_a_proj_with_mqa(x), [kv_lora_rank, R])           # latent, one shared rotary key
    k_nope, v = split(kv_b_proj(kv_a_layernorm(c)), [N, Dv])             # per head
    keys = cat[k_nope, rope(k_rot) for every head], queries = cat[q_nope, rope(q_rot)]
The cache holds each head's expanded key [N + R] and value [Dv] (simple and exact; a latent cache would be
smaller). The softmax scale is (N + R)^-0.5, times mscale^2 under yarn scaling with mscale_all_dim.

MoE: router logits in float32, sigmoid scores; experts are chosen among the topk_group groups whose two best
(score + e_score_correction_bias) sum highest, weighted by their plain scores (normalised when norm_topk_prob)
times routed_scaling_factor; shared experts are added. Routing reads which experts were hit on the host, so
a MoE target runs eagerly (no CUDA graphs).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from toolkit.infer.config import ModelConfig
from toolkit.infer.fp32 import KeepsFp32


def rotate_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE over interleaved pairs (x0, x1), (x2, x3), ...; the result comes out with the pairs' first and
    second members in two halves (queries and keys alike, so their dot products are those of the pairs).
    cos/sin from attention.rope_cos_sin: [cos, cos] and [-sin, sin] halves."""
    half = x.shape[-1] // 2
    c, s = cos[..., :half], sin[..., half:]
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.cat([even * c - odd * s, odd * c + even * s], dim=-1)


class MLAAttention(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        from toolkit.infer.norm import RMSNorm

        self.c, m = c, c.mla
        H, Hq = c.hidden_size, c.num_heads
        self.qk_dim = m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank is None:
            self.q_proj = nn.Linear(H, Hq * self.qk_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(H, m.q_lora_rank, bias=c.attention_bias)
            self.q_a_layernorm = RMSNorm(m.q_lora_rank, 1e-6)
            self.q_b_proj = nn.Linear(m.q_lora_rank, Hq * self.qk_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(H, m.kv_lora_rank + m.qk_rope_head_dim, bias=c.attention_bias)
        self.kv_a_layernorm = RMSNorm(m.kv_lora_rank, 1e-6)
        self.kv_b_proj = nn.Linear(m.kv_lora_rank, Hq * (m.qk_nope_head_dim + m.v_head_dim), bias=False)
        self.o_proj = nn.Linear(Hq * m.v_head_dim, H, bias=c.attention_bias)
        self.scale = self.qk_dim ** -0.5 * c.softmax_mscale()

    def forward(self, x, cos, sin, mask, cache, layer: int, slots, kv_len: int):
        """As attention.Attention.forward; cos/sin over the R rotary dims."""
        B, T, _ = x.shape
        m, Hq = self.c.mla, self.c.num_heads
        N, R = m.qk_nope_head_dim, m.qk_rope_head_dim
        q = self.q_proj(x) if m.q_lora_rank is None else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(B, T, Hq, N + R).transpose(1, 2)                               # [B, Hq, T, N + R]
        latent, k_rot = self.kv_a_proj_with_mqa(x).split([m.kv_lora_rank, R], -1)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent)).view(B, T, Hq, N + m.v_head_dim).transpose(1, 2)
        k_nope, v = kv.split([N, m.v_head_dim], -1)                               # [B, Hq, T, N], [.., Dv]
        rope = rotate_interleaved if m.rope_interleave else _rotate
        q_rot, k_rot = rope(q[..., N:], cos, sin), rope(k_rot[:, None], cos, sin)  # k_rot [B, 1, T, R]
        q = torch.cat([q[..., :N], q_rot], -1)
        k = torch.cat([k_nope, k_rot.expand(B, Hq, T, R)], -1)                     # [B, Hq, T, N + R]
        if cache is not None:
            cache.write(layer, k, v, slots)
            k, v = cache.k[layer, :B, :, :kv_len], cache.v[layer, :B, :, :kv_len]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=None if mask is None else mask[0],
                                             is_causal=mask is None and T > 1, scale=self.scale)  # [B, Hq, T, Dv]
        return self.o_proj(out.transpose(1, 2).reshape(B, T, Hq * m.v_head_dim))


def _rotate(x, cos, sin):
    from toolkit.infer.attention import rotate

    return rotate(x, cos, sin)


class Router(KeepsFp32):
    keep_fp32 = ("weight", "e_score_correction_bias")  # as transformers and SGLang route

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.moe = c.moe
        self.weight = nn.Parameter(torch.zeros(c.moe.num_experts, c.hidden_size))
        self.register_buffer("e_score_correction_bias", torch.zeros(c.moe.num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [n, H] -> (expert ids [n, k], weights [n, k] float32)."""
        moe = self.moe
        scores = F.linear(x.float(), self.weight.float()).sigmoid()                 # [n, E]
        choice = scores + self.e_score_correction_bias
        groups = choice.view(len(x), moe.n_group, -1)                               # [n, G, E/G]
        best = groups.topk(2, dim=-1).values.sum(-1)                                # [n, G]
        keep = torch.zeros_like(best).scatter_(1, best.topk(moe.topk_group, dim=-1).indices, 1.0)
        choice = choice.masked_fill(~keep.bool()[:, :, None].expand_as(groups).reshape(len(x), -1), float("-inf"))
        ids = choice.topk(moe.top_k, dim=-1).indices                                # [n, k]
        weights = scores.gather(1, ids)
        if moe.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return ids, weights * moe.routed_scaling_factor


class MoE(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        from toolkit.infer.model import MLP

        moe = c.moe
        self.gate = Router(c)
        self.experts = nn.ModuleList(MLP(c, moe.intermediate_size) for _ in range(moe.num_experts))
        self.shared_experts = MLP(c, moe.intermediate_size * moe.n_shared_experts) if moe.n_shared_experts else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape, flat = x.shape, x.reshape(-1, x.shape[-1])                            # [n, H]
        ids, weights = self.gate(flat)
        out = torch.zeros_like(flat)
        for e in ids.unique().tolist():                                             # the experts hit (host)
            rows, slot = (ids == e).nonzero(as_tuple=True)
            y = self.experts[e](flat[rows]) * weights[rows, slot, None]
            out.index_add_(0, rows, y.to(out.dtype))
        out = out.view(shape)
        return out if self.shared_experts is None else out + self.shared_experts(x)
