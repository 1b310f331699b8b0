"""Mixture-of-experts MLPs for the engine (sizes and routing: moe_config.py). n tokens, H hidden, E experts, k
chosen per token:

    ids, weights = router(x)                        # [n, k] experts and their weights
    out = sum over the k of weights * experts[ids](x)  (+ the shared expert, gated on Qwen2-MoE)

Routers: DeepSeek-V3's (GroupedSigmoidRouter: float32 weights and correction bias, sigmoid scores, top-k among
the topk_group best groups, scaled) and Mixtral's / Qwen-MoE's (SoftmaxRouter: logits in the model's dtype,
softmax in float32, top-k, renormalised when norm_topk_prob; Qwen rounds the weights to the model's dtype), each
as transformers routes. The experts hit are read on the host, so a MoE target (or head) runs eagerly (no CUDA graphs).
Checkpoint names are transformers' (mlp.gate, mlp.experts.{e}.{gate,up,down}_proj, mlp.shared_expert(s),
mlp.shared_expert_gate); Mixtral's block_sparse_moe.experts.{e}.w1/w3/w2 are renamed on load (hf_names.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from toolkit.infer.config import ModelConfig
from toolkit.infer.fp32 import KeepsFp32

def combine_experts(flat: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, expert) -> torch.Tensor:
    """flat [n, H], ids / weights [n, k] -> [n, H]: each token's sum over its k experts of weight * expert(e, x)
    (expert e over the tokens routed to it, x [m, H] -> [m, H]), one call per expert hit (read on the host)."""
    out = torch.zeros_like(flat)
    for e in ids.unique().tolist():
        rows, slot = (ids == e).nonzero(as_tuple=True)
        out.index_add_(0, rows, (expert(e, flat[rows]) * weights[rows, slot, None]).to(out.dtype))
    return out


class GroupedSigmoidRouter(KeepsFp32):
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


class SoftmaxRouter(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.moe = c.moe
        self.weight = nn.Parameter(torch.zeros(c.moe.num_experts, c.hidden_size))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [n, H] -> (expert ids [n, k], weights [n, k]: float32, or x's dtype for Qwen)."""
        probs = F.linear(x, self.weight).float().softmax(-1)                        # [n, E]
        weights, ids = probs.topk(self.moe.top_k, dim=-1)                           # [n, k]
        if self.moe.norm_topk_prob:
            weights = weights / weights.sum(-1, keepdim=True)
        return ids, weights.to(x.dtype) if self.moe.weights_in_model_dtype else weights


class MoE(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        from toolkit.infer.model import MLP

        moe = c.moe
        self.gate = GroupedSigmoidRouter(c) if moe.scoring == "sigmoid" else SoftmaxRouter(c)
        self.experts = nn.ModuleList(MLP(c, moe.intermediate_size) for _ in range(moe.num_experts))
        shared = MLP(c, moe.shared_size) if moe.shared_size else None
        if moe.shared_gate:  # Qwen2-MoE's names
            self.shared_expert, self.shared_expert_gate = shared, nn.Linear(c.hidden_size, 1, bias=False)
        else:                # DeepSeek's
            self.shared_experts = shared

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape, flat = x.shape, x.reshape(-1, x.shape[-1])                            # [n, H]
        ids, weights = self.gate(flat)
        out = combine_experts(flat, ids, weights, lambda e, x: self.experts[e](x))
        if getattr(self, "shared_expert", None) is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(flat)) * self.shared_expert(flat)
        elif getattr(self, "shared_experts", None) is not None:
            out = out + self.shared_experts(flat)
        return out.view(shape)
