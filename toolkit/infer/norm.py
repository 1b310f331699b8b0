"""RMSNorm, the Llama family's norm (the target's layers and final norm, the draft heads', q/k norms): normalised in
fp32 and rounded as transformers' LlamaRMSNorm rounds it, optionally after a residual add (h = residual + x, and
its norm); with kernels "triton" one fused kernel (kernels/layer_ops.py). `fp32_product`: scaled by the weight in
fp32 and then rounded, as GptOssRMSNorm does (the same in fp32; in bf16 a rounding step apart from Llama's).
`offset` 1: scaled by (1 + weight) in fp32, Gemma's (its weights are stored around 0).
Shapes: x [..., H] -> [..., H]."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    kernels = "torch"  # per instance: Transformer.set_kernels

    def __init__(self, dim: int, eps: float, fp32_product: bool = False, offset: float = 0.0):
        super().__init__()
        self.eps, self.weight, self.fp32_product = eps, nn.Parameter(torch.ones(dim)), fp32_product
        self.offset = offset

    @classmethod
    def of(cls, c, dim: int | None = None) -> "RMSNorm":
        """A target's norm over `dim` (default hidden_size) as its family rounds it (c: a ModelConfig)."""
        gemma = c.gemma is not None
        return cls(dim or c.hidden_size, c.rms_norm_eps, c.norm_fp32_product or gemma, 1.0 if gemma else 0.0)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """RMSNorm(x), or with a residual (h = residual + x, RMSNorm(h)) in one fused kernel when asked."""
        if self.kernels == "triton":
            from toolkit.infer.kernels.layer_ops import rms_norm

            return rms_norm(x, self.weight, self.eps, residual, fp32_product=self.fp32_product, offset=self.offset)
        if residual is not None:
            x = residual + x
            return x, self(x)
        if x.dtype == torch.float32 and not self.offset:  # one fused op, bit-identical to the lines below in fp32
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.offset:  # Gemma: (1 + w) in fp32, as Gemma3RMSNorm
            return ((self.offset + self.weight.float()) * h).to(x.dtype)
        return (self.weight.float() * h).to(x.dtype) if self.fp32_product else self.weight * h.to(x.dtype)
