"""The precisions of a training run on a GPU: the head's (`mixed_precision`) and the frozen target's (`dtype`).

accelerate's own default is no mixed precision, and `accelerate launch` exports "no" when given nothing (so is
every ZeRO launch: those config files may not name one). The frozen target runs in the GPU's half precision
(`dtype: auto`), so a head left in fp32 beside it spends twice the memory and its matmuls run at fp32 rates, which
SpecForge and the EAGLE repo never do. auto therefore keeps a bf16 / fp16 the launch named, else takes bf16 on a
card with a bf16 matrix unit (sm_80+) and fp16 before it (V100, T4: accelerate then scales the loss, and under
DeepSpeed its config gains an fp16 section), where bf16 is emulated at fp32 rates: asked for there, it is refused.
The CPU rule (by measured GEMM rates) is in toolkit/cpu_speed.py.
"""
from __future__ import annotations

import sys

import torch

from toolkit.gpu_half import gpu_label, half_dtype, refuse_bf16

HALF = ("bf16", "fp16")


def gpu_training_precision(requested: str, launched: str | None, bf16: bool, device=None) -> str:
    """requested: the recipe's mixed_precision (auto | no | bf16 | fp16); launched: ACCELERATE_MIXED_PRECISION;
    bf16: the GPU has a bf16 matrix unit (gpu_half.has_bf16). An explicit recipe value is kept, bf16 on a GPU
    without one refused."""
    setting = f"mixed_precision {requested}"
    if requested == "auto":
        if launched in HALF:
            requested, setting = launched, f"accelerate launch --mixed_precision {launched}"
        else:
            requested = "bf16" if bf16 else "fp16"
    if requested == "bf16" and not bf16:
        refuse_bf16(setting, "give mixed_precision fp16 (auto picks it there) or no", device)
    return requested


def target_dtype(dtype: str, device: torch.device, mixed_precision: str) -> torch.dtype:
    """The frozen target's dtype. dtype: the recipe's (auto | float32 | bfloat16 | float16). auto: the GPU's half
    precision; on a CPU bf16 under bf16 autocast (its matmuls run ~2x fp32 there, the head's the same way), else
    fp32."""
    if device.type == "cuda":
        if dtype == "bfloat16":
            refuse_bf16("dtype bfloat16", "give dtype float16 (auto picks it there) or float32", device)
        if dtype == "auto" and half_dtype(device) == torch.float16:
            print(f"dtype auto: {gpu_label(device)} has no bf16 matrix unit; the target runs in float16 (a model "
                  "trained in bf16 can overflow float16's range, Gemma's known to: training stops if its loss goes "
                  "nan or every step is skipped; give dtype float32 then)", file=sys.stderr, flush=True)
        return half_dtype(device) if dtype == "auto" else getattr(torch, dtype)
    if dtype == "auto":
        return torch.bfloat16 if mixed_precision == "bf16" else torch.float32
    return getattr(torch, dtype)
