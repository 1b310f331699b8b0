"""Target transformer (Llama family: Llama 2/3/3.1, Mistral, Qwen2/2.5, Qwen3, SmolLM2), gpt-fast style.

One forward serves prefill, decode and tree verification: each token has a rope position and a cache slot
it is written to, and attends to the cache slots its mask allows. It returns logits and the hidden states
of chosen layers (EAGLE-3 takes three): the OUTPUT of layer l, i.e. the residual stream before any final
norm, which is transformers' `hidden_states[l + 1]` (index 0 is the embedding) and the tensor SGLang
captures as the input of layer l + 1.
Shapes: B batch, T new tokens, S cache slots, H hidden, D head dim, Hq/Hkv query/key-value heads, V vocab.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from toolkit.infer.config import ModelConfig
from toolkit.infer.fp32 import Fp32Readout
from toolkit.infer.kv_cache import KVCache
from toolkit.infer.row_step import few_rows, row_step, row_step_ok


class RMSNorm(nn.Module):
    kernels = "torch"  # per instance: Transformer.set_kernels

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """RMSNorm(x), or with a residual (h = residual + x, RMSNorm(h)) in one fused kernel when asked."""
        if self.kernels == "triton":
            from toolkit.infer.kernels.layer_ops import rms_norm

            return rms_norm(x, self.weight, self.eps, residual)
        if residual is not None:
            x = residual + x
            return x, self(x)
        if x.dtype == torch.float32:  # one fused op, bit-identical to the lines below in fp32
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


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
    """RoPE in the HF (half-split, not interleaved) layout. x [B, h, T, D], cos/sin [B, 1, T, D] from
    rope_cos_sin: x * cos + cat([-x2, x1]) * sin == x * cos + cat([x2, x1]) * cat([-sin1, sin2])."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


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
            self.q_norm, self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps), RMSNorm(c.head_dim, c.rms_norm_eps)
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
            and not isinstance(slots, int)

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
        if mask is not None and mask[1] is not None:  # the Triton kernel (set_kernels("triton"))
            from toolkit.infer.kernels.tree_attention import tree_attention

            return tree_attention(q, k, v, mask[1], lens=mask[2])
        # mask None: causal over T > 1 new tokens (the fused causal kernel), or one token seeing all
        return F.scaled_dot_product_attention(q, k, v, attn_mask=None if mask is None else mask[0],
                                              is_causal=mask is None and q.shape[2] > 1,
                                              enable_gqa=self.c.num_heads != self.c.num_kv_heads)


class MLP(nn.Module):
    kernels = "torch"  # per instance: Transformer.set_kernels

    def __init__(self, c: ModelConfig, intermediate: int | None = None):  # a MoE expert has its own size
        super().__init__()
        inner = intermediate or c.intermediate_size
        self.gate_proj = nn.Linear(c.hidden_size, inner, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, inner, bias=False)
        self.down_proj = nn.Linear(inner, c.hidden_size, bias=False)
        self.register_buffer("gate_up", None, persistent=False)   # fused [gate; up] weight: Transformer.fuse

    def forward(self, x):
        if self.gate_up is None:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        if self.kernels == "triton":
            from toolkit.infer.kernels.layer_ops import silu_mul

            return self.down_proj(silu_mul(F.linear(x, self.gate_up)))
        gate, up = F.linear(x, self.gate_up).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, c: ModelConfig, layer: int = 0):
        """Layer `layer` of a model of config c: DeepSeek's MLA and (from moe.first_dense on) MoE, else Llama's."""
        super().__init__()
        from toolkit.infer.deepseek import MLAAttention, MoE

        self.self_attn = MLAAttention(c) if c.mla is not None else Attention(c)
        self.mlp = MoE(c) if c.moe is not None and layer >= c.moe.first_dense else MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, h, cos, sin, mask, cache, layer, slots, kv_len):
        if row_step_ok(self.self_attn, self.mlp, h, cache, slots):
            norm = self.input_layernorm
            return row_step(self.self_attn, self.mlp, self.post_attention_layernorm,
                            {"x": h, "prologue": "norm", "norm_w": norm.weight, "eps": norm.eps}, h,
                            cos, sin, mask, cache, layer, slots, kv_len)
        a = self.self_attn(self.input_layernorm(h), cos, sin, mask, cache, layer, slots, kv_len)
        h, x = self.post_attention_layernorm(a, residual=h)  # h + a, and its norm (one kernel with Triton)
        return h + self.mlp(x)


class Transformer(Fp32Readout):
    keep_fp32 = ("inv_freq",)

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.config = c
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(Block(c, i) for i in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.register_buffer("inv_freq", c.inv_freq(), persistent=False)

    kernels = "torch"

    def set_kernels(self, kernels: str) -> "Transformer":
        """"torch", or "triton": masked attention over the cache (kernels/tree_attention.py), RMSNorm with the
        residual add, SiLU-mul and RoPE + cache write (kernels/layer_ops.py) as fused Triton kernels, and for
        steps of at most 16 tokens the projections as GEMVs with the norms, SiLU-mul and residual adds folded in
        (kernels/gemv.py, row_step). Triton needs a CUDA model, or TRITON_INTERPRET=1 on CPU (tests); DeepSeek
        MLA targets keep torch's."""
        from toolkit.infer.prepare import apply_kernels

        return apply_kernels(self, kernels)

    def fuse(self) -> "Transformer":
        """For inference: fused q/k/v and gate/up weights (fuse_projections), the readout in readout_layout."""
        from toolkit.infer.prepare import fuse_projections, readout_layout

        fuse_projections(self)
        readout_layout(self.lm_head)
        if self.config.tie_word_embeddings:
            self.embed_tokens.weight = self.lm_head.weight
        return self

    @property
    def graphable(self) -> bool:
        """False for MoE targets: their routing reads which experts were hit on the host."""
        return self.config.moe is None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None,
                cache: KVCache | None = None, slots: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, aux_layers: list[int] = (), kv_len: int | None = None,
                logits_at: torch.Tensor | None = None):
        """input_ids/positions/slots [B, T]; mask bool [B, T, S] over cache slots (or over the T new tokens
        without a cache), default causal by position. Returns logits [B, T, V] and [aux hidden [B, T, H]]
        for each id in aux_layers (a layer's output; -1 = after the final norm). kv_len (= S, with a mask):
        the cache slots attended, given by CUDA-graph callers so no shape depends on the slots' values.
        logits_at [B] (a prefill): the one position per row whose logits are wanted; logits are then [B, 1, V]
        (the vocabulary projection is a fifth of a SmolLM2 prefill's FLOPs, and only the last token's is read)."""
        B, T = input_ids.shape
        if cache is None and self.config.context_limit()[0] is not None:  # the engine checks its cache's length
            self.config.check_sequence(T if positions is None else int(positions.max()) + 1)
        in_order = positions is None and slots is None  # token t at position t in slot t
        if positions is None:
            positions = torch.arange(T, device=input_ids.device).expand(B, T)
        slots = positions if slots is None else slots
        if kv_len is None:  # with a cache: the slots a mask covers, else the slots written reach
            kv_len = T if cache is None else mask.shape[-1] if mask is not None else int(slots.max()) + 1
        if cache is not None and kv_len > cache.max_len:
            raise ValueError(f"sequence needs {kv_len} cache slots but the KV cache holds {cache.max_len}; "
                             f"raise --max-seq-len or shorten the prompt")
        # no mask at all: T > 1 tokens without a cache or written in order from slot 0 (a prefill): SDPA's
        # causal kernel; or one sequence's one token, which sees every slot up to its own (plain decoding)
        unmasked = mask is None and ((T > 1 and (cache is None or in_order)) or (B == 1 and T == 1))
        if mask is None:  # causal by position over the slots that hold them (slot == position here)
            mask = torch.arange(kv_len, device=input_ids.device)[None, None, :] <= positions[:, :, None]
        h = self.embed_tokens(input_ids)                                   # [B, T, H]
        cos, sin = rope_cos_sin(positions, self.inv_freq, h.dtype, self.config.rope_attention_factor(), self.kernels)
        bias = None if unmasked else attention_masks(mask, h.dtype, self.kernels)
        if cache is not None and self.kernels == "torch":
            slots = cache.slot_range(slots)  # one sequence's contiguous host slots -> int start (a plain copy)
        kept = {}
        for i, layer in enumerate(self.layers):
            h = layer(h, cos, sin, bias, cache, i, slots, kv_len)
            if i in aux_layers:
                kept[i] = h
        if logits_at is None and -1 not in aux_layers and few_rows(h, self.kernels) and not self.logits_fp32:
            from toolkit.infer.kernels.gemv import gemv  # the norm in the GEMV

            return gemv(h, self.lm_head.weight, "norm", self.norm.weight, self.norm.eps), [kept[i] for i in aux_layers]
        kept[-1] = self.norm(h)  # id -1: the final normed hidden state (EAGLE-1/2 heads take it)
        out = kept[-1] if logits_at is None else kept[-1][torch.arange(B, device=h.device), logits_at][:, None]
        return self.readout(out), [kept[i] for i in aux_layers]
