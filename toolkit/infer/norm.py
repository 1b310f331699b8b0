"""RMSNorm, the Llama family's norm (the target's layers and final norm, the draft heads', q/k norms): normalised in
fp32 and rounded as transformers' LlamaRMSNorm rounds it, optionally after a residual add (h = residual + x, and
its norm); with kernels "triton" one fused kernel (kernels/layer_ops.py). Shapes: x [..., H] -> [..., H]."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


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
