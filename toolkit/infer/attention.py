"""Attention of the Llama-family layer (the target's, and the draft heads' that reuse it), and what a forward builds
once for all its layers: rope's cos / sin tables (rope_cos_sin), rotated in by `rotate`, and the masks
(attention_masks). Each token's k / v are written to its cache slot before it attends to the slots its mask
allows: with SDPA, or with kernels "triton" the fused RoPE + cache write and the tree-attention kernel. GPT-OSS's
attention sinks (a learned logit per query head in every softmax, with no value) go through eager_attention, or
the kernel's sink term; so do Gemma 2's soft-capped scores. Gemma scales scores by query_pre_attn_scalar^-0.5 and
norms q / k by (1 + w) (Gemma 3).
Shapes: B batch, T new tokens, S cache slots, H hidden, D head dim, Hq/Hkv query/key-value heads.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from toolkit.infer.config import ModelConfig
from toolkit.infer.kv_cache import KVCache
from toolkit.infer.norm import RMSNorm


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, dtype, factor: float = 1.0, kernels: str = "torch"
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [B, T] -> cos, sin [B, 1, T, D] (angles in float32, as transformers computes them; times
    yarn's attention factor). The first half of sin is negated, so that `rotate` needs one roll instead of
    HF's rotate_half (split, neg, cat); the products are the same numbers."""
    if kernels == "triton":  # the same numbers from one fused kernel
        from toolkit.infer.kernels.layer_ops import rope_cos_sin as fused

        return fused(positions, inv_freq, dtype, factor)
    angles = positions[:, None, :, None].float() * inv_freq
    cos, sin = torch.cat([angles, angles], dim=-1).cos(), angles.sin()
    sin = torch.cat([-sin, sin], dim=-1)
    if factor != 1.0:
        cos, sin = cos * factor, sin * factor
    return cos.to(dtype), sin.to(dtype)


def attention_masks(mask: torch.Tensor, dtype, kernels: str = "torch") -> tuple:
    """bool [B, T, S] -> (additive float [B, 1, T, S] for SDPA, None, None), or for the Triton kernel
    (None, int8 mask [B, T, S], lens [B]: one past the last slot any of row b's tokens sees)."""
    if kernels == "triton":
        from toolkit.infer.kernels.tree_attention import mask_lens

        mask = mask.contiguous()
        return None, mask.view(torch.int8), mask_lens(mask)  # bool is one byte: a view
    bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
    return bias[:, None], None, None


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE in the HF (half-split, not interleaved) layout. x [B, h, T, D], cos/sin [B, 1, T, R] from
    rope_cos_sin: x * cos + cat([-x2, x1]) * sin == x * cos + cat([x2, x1]) * cat([-sin1, sin2]); with R < D
    (partial_rotary_factor) the first R dims rotate and the rest pass through, as transformers' GLM."""
    R = cos.shape[-1]
    if R < x.shape[-1]:
        return torch.cat([rotate(x[..., :R], cos, sin), x[..., R:]], dim=-1)
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


def eager_attention(q, k, v, bias, sinks=None, block: int = 1 << 26, scale: float | None = None,
                    softcap: float | None = None) -> torch.Tensor:
    """Attention as explicit scores, for what SDPA lacks: GPT-OSS's sinks (as transformers' GPT-OSS attends:
    softmax over [scores, sinks[h]], the sink's share dropped) and Gemma 2's soft-capped scores (tanh(s / cap) *
    cap before the mask, as transformers' Gemma 2). q [B, Hq, T, D], k/v [B, Hkv, S, D], bias additive [B, 1, T, S]
    (None: causal, the T queries at the last T slots), sinks [Hq] or None, scale (default D^-0.5) ->
    [B, Hq, T, D]. Scores in the inputs' dtype, the softmax in float32. The queries go in chunks of at most
    `block` scores (256 MiB in float32): a long prefill's B x Hq x T x S at once was 17 GB for gpt-oss-20b's 64
    heads at 8k tokens."""
    B, Hq, T, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    rows = max(1, block // (B * Hq * S))
    if T > rows:  # causal: a chunk's queries see no key past its last one's slot (a bias may say otherwise)
        ends = [S if bias is not None else S - T + min(t + rows, T) for t in range(0, T, rows)]
        return torch.cat([eager_attention(q[:, :, t:t + rows], k[:, :, :end], v[:, :, :end],
                                          None if bias is None else bias[:, :, t:t + rows], sinks, block, scale,
                                          softcap)
                          for t, end in zip(range(0, T, rows), ends)], 2)
    scores = (q.reshape(B, Hkv, -1, D) @ k.transpose(-1, -2)).view(B, Hq, T, S)
    if softcap is not None:  # transformers' Gemma 2 caps in the inputs' dtype
        scores = torch.tanh(scores * (D ** -0.5 if scale is None else scale) / softcap) * softcap
        scores = scores.float()
    else:
        scores = scores.float() * (D ** -0.5 if scale is None else scale)
    if bias is not None:
        scores = scores + bias
    elif T > 1:
        causal = torch.arange(S, device=q.device)[None, :] <= torch.arange(S - T, S, device=q.device)[:, None]
        scores = scores.masked_fill(~causal, float("-inf"))
    if sinks is None:  # a row that sees no slot (a graph's padding) weighs nothing, as SDPA's safe softmax
        probs = scores.softmax(-1).nan_to_num_(0.0).to(v.dtype)
    else:
        sink = sinks.float().view(1, Hq, 1, 1).expand(B, Hq, T, 1)
        probs = torch.cat([scores, sink], -1).softmax(-1)[..., :-1].to(v.dtype)      # [B, Hq, T, S]
    return (probs.view(B, Hkv, -1, S) @ v).view(B, Hq, T, D)


class Attention(nn.Module):
    def __init__(self, c: ModelConfig, in_features: int | None = None):  # EAGLE-3's layer takes 2H inputs
        super().__init__()
        self.c = c
        d = in_features or c.hidden_size
        self.q_proj = nn.Linear(d, c.num_heads * c.head_dim, bias=c.qkv_bias)
        self.k_proj = nn.Linear(d, c.num_kv_heads * c.head_dim, bias=c.qkv_bias)
        self.v_proj = nn.Linear(d, c.num_kv_heads * c.head_dim, bias=c.qkv_bias)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=c.attention_bias)
        if c.qk_norm:
            self.q_norm, self.k_norm = RMSNorm.of(c, c.head_dim), RMSNorm.of(c, c.head_dim)
        self.scale = None if c.gemma is None else c.gemma.scale                  # None: SDPA's D^-0.5
        self.softcap = None if c.gemma is None else c.gemma.attn_softcap
        if c.attention_sinks:
            self.sinks = nn.Parameter(torch.zeros(c.num_heads))  # a logit per query head (GPT-OSS)
        self.register_buffer("qkv", None, persistent=False)       # fused [q; k; v] weight: Transformer.fuse
        self.register_buffer("qkv_b", None, persistent=False)

    kernels = "torch"  # per instance: Transformer.set_kernels

    def forward(self, x, cos, sin, mask, cache: KVCache | None, layer: int, slots, kv_len: int):
        """mask: attention_masks(...) or None for plain causal attention."""
        B, T, _ = x.shape
        c = self.c
        q, k, v = self._project(x, cos, sin, cache, layer, slots, kv_len)
        return self.o_proj(self._attend(q, k, v, mask).transpose(1, 2).reshape(B, T, c.num_heads * c.head_dim))

    def _project(self, x, cos, sin, cache: KVCache | None, layer: int, slots, kv_len: int):
        """q [B, Hq, T, D] rotated, and k/v [B, Hkv, S, D]: the cache's slots once the new ones are written
        (without a cache, the T new tokens')."""
        B, T, _ = x.shape
        c = self.c
        if self.fused_rope_ok(cache, slots):  # one kernel: RoPE on q and k, k and v into the cache
            return self._rope_write(F.linear(x, self.qkv, self.qkv_b), cos, sin, cache, layer, slots, kv_len)
        q, k, v = self.qkv_proj(x)
        q = q.view(B, T, c.num_heads, c.head_dim)                        # [B, T, Hq, D]
        k = k.view(B, T, c.num_kv_heads, c.head_dim)                     # [B, T, Hkv, D]
        v = v.view(B, T, c.num_kv_heads, c.head_dim).transpose(1, 2)     # [B, Hkv, T, D]
        if c.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotate(q.transpose(1, 2), cos, sin), rotate(k.transpose(1, 2), cos, sin)  # [B, h, T, D]
        if cache is not None:
            cache.write(layer, k, v, slots)
            k, v = cache.k[layer, :B, :, :kv_len], cache.v[layer, :B, :, :kv_len]  # [B, Hkv, S, D]
        return q, k, v

    def fused_rope_ok(self, cache: KVCache | None, slots) -> bool:
        """The Triton path from the fused q/k/v GEMM's output: RoPE + cache write as one kernel."""
        return self.kernels == "triton" and self.qkv is not None and cache is not None and not self.c.qk_norm \
            and self.c.rotary_dim is None and not isinstance(slots, int)

    def _rope_write(self, qkv, cos, sin, cache: KVCache, layer: int, slots, kv_len: int):
        """qkv [B, T, (Hq + 2 Hkv) D] -> q [B, Hq, T, D] rotated, k/v [B, Hkv, S, D] (the cache's slots, the new
        ones written)."""
        from toolkit.infer.kernels.layer_ops import rope_cache_write

        B, c = qkv.shape[0], self.c
        q = rope_cache_write(qkv, cos, sin, slots, cache.k[layer], cache.v[layer], c.num_heads, c.num_kv_heads)
        return q, cache.k[layer, :B, :, :kv_len], cache.v[layer, :B, :, :kv_len]

    def attend_qkv(self, qkv, cos, sin, mask, cache: KVCache, layer: int, slots, kv_len: int):
        """The Triton path after the fused q/k/v GEMM: qkv [B, T, *] -> attention output [B, T, Hq*D] (before
        o_proj)."""
        q, _, _ = self._rope_write(qkv, cos, sin, cache, layer, slots, kv_len)
        return self.attend_rotated(q, mask, cache, layer, kv_len)

    def attend_rotated(self, q, mask, cache: KVCache, layer: int, kv_len: int):
        """q [B, Hq, T, D] rotated, the step's k / v already in the cache -> attention output [B, T, Hq*D]."""
        B, _, T, _ = q.shape
        k, v = cache.k[layer, :B, :, :kv_len], cache.v[layer, :B, :, :kv_len]
        return self._attend(q, k, v, mask).transpose(1, 2).reshape(B, T, self.c.num_heads * self.c.head_dim)

    def qkv_proj(self, x):
        """x [B, T, *] -> q [B, T, Hq*D], k and v [B, T, Hkv*D]."""
        c = self.c
        if self.qkv is None:  # separate projections (draft heads, training)
            return self.q_proj(x), self.k_proj(x), self.v_proj(x)
        # one GEMM over the fused weight (the target at inference)
        return F.linear(x, self.qkv, self.qkv_b).split(
            [c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.num_kv_heads * c.head_dim], -1)

    def _attend(self, q, k, v, mask):
        """q [B, Hq, T, D] over k/v [B, Hkv, S, D] -> [B, Hq, T, D]."""
        sinks = getattr(self, "sinks", None)
        if mask is not None and mask[1] is not None:  # the Triton kernel (set_kernels("triton"))
            from toolkit.infer.kernels.tree_attention import tree_attention

            return tree_attention(q, k, v, mask[1], self.scale, lens=mask[2], sinks=sinks, softcap=self.softcap)
        if sinks is not None or self.softcap is not None:
            return eager_attention(q, k, v, None if mask is None else mask[0], sinks, scale=self.scale,
                                   softcap=self.softcap)
        # mask None: causal over T > 1 new tokens (the fused causal kernel), or one token seeing all
        return F.scaled_dot_product_attention(q, k, v, attn_mask=None if mask is None else mask[0],
                                              is_causal=mask is None and q.shape[2] > 1, scale=self.scale,
                                              enable_gqa=self.c.num_heads != self.c.num_kv_heads)
