"""GPT-OSS's mixture-of-experts MLP, as transformers' GptOssMLP computes it (its attention is the Llama-family
Attention with biases and sinks: attention.py; its sizes and routing: moe_config.py). n tokens, H hidden, I per
expert, E experts, k chosen per token:

    logits = x @ router.weight.T + router.bias               # [n, E]
    ids, top = topk(logits, k); weights = softmax(top)       # softmax over the k chosen only
    gate, up = (x @ gate_up_proj[e] + gate_up_proj_bias[e]) split even / odd columns (interleaved on disk)
    y_e = ((clamp(up, -L, L) + 1) * g * sigmoid(alpha * g)) @ down_proj[e] + down_proj_bias[e],  g = min(gate, L)
    out = sum over the k of weights * y_e

Checkpoint names are transformers' (mlp.router.{weight,bias}, mlp.experts.{gate_up_proj,gate_up_proj_bias,
down_proj,down_proj_bias}: the experts' weights stacked, [E, H, 2I] and [E, I, H]); OpenAI's MXFP4 blocks and
scales are dequantized on load (mxfp4.py). The experts hit are read on the host: the target runs eagerly.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from toolkit.infer.config import ModelConfig
from toolkit.infer.moe import combine_experts


class TopKSoftmaxRouter(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.top_k = c.moe.top_k
        self.weight = nn.Parameter(torch.zeros(c.moe.num_experts, c.hidden_size))
        self.bias = nn.Parameter(torch.zeros(c.moe.num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [n, H] -> (expert ids [n, k], weights [n, k] in x's dtype, as transformers routes)."""
        top, ids = F.linear(x, self.weight, self.bias).topk(self.top_k, dim=-1)   # [n, k]
        return ids, top.softmax(-1)


class ClampedSwiGLUExperts(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        E, H, inner = c.moe.num_experts, c.hidden_size, c.moe.intermediate_size
        self.limit, self.alpha = c.moe.swiglu_limit, c.moe.swiglu_alpha
        self.gate_up_proj = nn.Parameter(torch.zeros(E, H, 2 * inner))   # columns gate0, up0, gate1, up1, ...
        self.gate_up_proj_bias = nn.Parameter(torch.zeros(E, 2 * inner))
        self.down_proj = nn.Parameter(torch.zeros(E, inner, H))
        self.down_proj_bias = nn.Parameter(torch.zeros(E, H))

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert e over its tokens x [m, H] -> [m, H]."""
        gate_up = x @ self.gate_up_proj[e] + self.gate_up_proj_bias[e]               # [m, 2I]
        gate = gate_up[:, 0::2].clamp(max=self.limit)
        up = gate_up[:, 1::2].clamp(-self.limit, self.limit)
        act = (up + 1) * gate * torch.sigmoid(gate * self.alpha)                    # [m, I]
        return act @ self.down_proj[e] + self.down_proj_bias[e]


class GptOssMoE(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.router = TopKSoftmaxRouter(c)
        self.experts = ClampedSwiGLUExperts(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape, flat = x.shape, x.reshape(-1, x.shape[-1])                            # [n, H]
        ids, weights = self.router(flat)
        return combine_experts(flat, ids, weights, self.experts.expert).view(shape)
