"""Gemma 2 / Gemma 3's decoder layer, and what its Transformer does around the layers (what each setting means:
gemma_config.py). The attention is model.py's (attention.py reads the scale, the soft-cap and the (1 + w) q / k
norms from the config), the MLP too (GELU); this layer norms the attention's and the MLP's outputs before their
residual adds. Shapes: B batch, T tokens, H hidden, V vocab.
"""
from __future__ import annotations

import torch
from torch import nn

from toolkit.infer.attention import Attention
from toolkit.infer.config import ModelConfig
from toolkit.infer.norm import RMSNorm


class GemmaBlock(nn.Module):
    def __init__(self, c: ModelConfig, layer: int = 0):
        super().__init__()
        from toolkit.infer.model import MLP

        self.self_attn, self.mlp = Attention(c), MLP(c)
        self.input_layernorm = RMSNorm.of(c)
        self.post_attention_layernorm = RMSNorm.of(c)    # the attention's output, before the residual add
        self.pre_feedforward_layernorm = RMSNorm.of(c)
        self.post_feedforward_layernorm = RMSNorm.of(c)  # the MLP's output, before the residual add

    def forward(self, h, cos, sin, mask, cache, layer, slots, kv_len):
        a = self.self_attn(self.input_layernorm(h), cos, sin, mask, cache, layer, slots, kv_len)   # [B, T, H]
        h = h + self.post_attention_layernorm(a)
        return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))


def embed_scale(c: ModelConfig, h: torch.Tensor) -> torch.Tensor:
    """The embedding [B, T, H] times sqrt(hidden_size), the factor rounded to h's dtype first (as transformers'
    Gemma3TextScaledWordEmbedding: 55.4256 becomes 55.5 in bf16)."""
    return h * torch.tensor(c.hidden_size ** 0.5, dtype=h.dtype)


def soft_cap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """final_logit_softcapping: tanh(logits / cap) * cap (order-preserving: greedy picks are unchanged, sampled
    ones are not)."""
    return logits if cap is None else torch.tanh(logits / cap) * cap
