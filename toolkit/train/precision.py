"""The head's training precision when a recipe says `mixed_precision: auto` on a GPU.

accelerate's own default is no mixed precision, and `accelerate launch` exports "no" when given nothing (so is
every ZeRO launch: those config files may not name one). The frozen target is bf16 on a GPU already (`dtype: auto`),
so a head left in fp32 beside it spends twice the memory and its matmuls run at fp32 rates, which SpecForge and the
EAGLE repo never do. auto therefore keeps a bf16 / fp16 the launch named, else takes bf16 on a card that has it,
else fp32. The CPU rule (by measured GEMM rates) is in toolkit/cpu_speed.py.
"""
from __future__ import annotations

HALF = ("bf16", "fp16")


def gpu_training_precision(requested: str, launched: str | None, bf16_supported: bool) -> str:
    """requested: the recipe's mixed_precision (auto | no | bf16 | fp16); launched: ACCELERATE_MIXED_PRECISION;
    bf16_supported: torch.cuda.is_bf16_supported(). An explicit recipe value is kept as it is."""
    if requested != "auto":
        return requested
    if launched in HALF:
        return launched
    return "bf16" if bf16_supported else "no"
