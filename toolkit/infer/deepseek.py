"""DeepSeek-V3's multi-head latent attention (MLA) for the engine; its mixture-of-experts MLP is moe.py's.
toolkit/infer/model.py picks them for `model_type: deepseek_v3` (Block), so a DeepSeek target, and the NextN
MTP layers it ships (toolkit/infer/mtp.py), run in the same engine as the Llama family.

MLA (B batch, T tokens, Hq heads, N = qk_nope_head_dim, R = qk_rope_head_dim, Dv = v_head_dim):
    q = q_b_proj(q_a_layernorm(q_a_proj(x)))  (or q_proj(x))             # [B, T, Hq, N + R]
    c, k_rot = split(kv_a_proj_with_mqa(x), [kv_lora_rank, R])           # latent, one shared rotary key
    k_nope, v = split(kv_b_proj(kv_a_layernorm(c)), [N, Dv])             # per head
    keys = cat[k_nope, rope(k_rot) for every head], queries = cat[q_nope, rope(q_rot)]
The cache holds each head's expanded key [N + R] and value [Dv] (simple and exact; a latent cache would be
smaller). The softmax scale is (N + R)^-0.5, times mscale^2 under yarn scaling with mscale_all_dim.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from toolkit.infer.config import ModelConfig


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
