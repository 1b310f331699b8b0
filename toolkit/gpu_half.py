"""Which half precision a CUDA GPU computes in: bf16 from compute capability 8.0 (A100, RTX 30xx and newer), fp16
before it (V100, T4, RTX 20xx), which has no bf16 matrix unit. torch.cuda.is_bf16_supported() says True there
too (bf16 emulated: cuBLAS at fp32 rates, Triton's tl.dot refuses it), so every default reads the capability.
Serving (infer/loading.pick_device), the trainer, its precision rule and the hidden-state dump all ask here.
"""
from __future__ import annotations

import torch


def gpu_label(device=None) -> str:
    """'Tesla T4 (sm_75)': how the errors and notes name the card."""
    major, minor = torch.cuda.get_device_capability(device)
    return f"{torch.cuda.get_device_name(device)} (sm_{major}{minor})"


def has_bf16(device=None) -> bool:
    """A bf16 matrix unit: compute capability 8.0 or later."""
    return torch.cuda.get_device_capability(device)[0] >= 8


def half_dtype(device=None) -> torch.dtype:
    """The GPU's half precision: bfloat16 where it has a bf16 matrix unit, else float16."""
    return torch.bfloat16 if has_bf16(device) else torch.float16


def refuse_bf16(setting: str, instead: str, device=None) -> None:
    """A ValueError naming `setting` (what asked for bf16) and `instead` (what to give) on a GPU without bf16."""
    if not has_bf16(device):
        raise ValueError(f"{setting} needs a GPU of compute capability 8.0 or later (A100, RTX 30xx and newer); "
                         f"this {gpu_label(device)} has no bf16 matrix unit: {instead}")
