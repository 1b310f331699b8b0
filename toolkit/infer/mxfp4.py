"""OpenAI's MXFP4 expert weights (gpt-oss-20b / -120b as released: `quantization_config.quant_method: mxfp4`),
dequantized on load to the model's dtype. Each expert tensor W is stored as two:

    {name}_blocks  uint8 [E, N, G, 16]  two FP4 (e2m1) codes a byte, the low nibble first: 32 values a group
    {name}_scales  uint8 [E, N, G]      the group's power of two, biased by 127 (an E8M0 exponent)

    value[e, n, 32 g + j] = FP4[code j of blocks[e, n, g]] * 2 ** (scales[e, n, g] - 127)

and W[e] is that [N, 32 G] matrix transposed: gate_up_proj [E, H, 2I] from N = 2I rows of H / 32 groups,
down_proj [E, I, H] from N = H rows of I / 32 groups (transformers' convert_moe_packed_tensors reads them so).
"""
from __future__ import annotations

import torch

# the 16 e2m1 codes: sign bit 3, then 0, 0.5, 1, 1.5, 2, 3, 4, 6
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
SUFFIXES = ("_blocks", "_scales")


def dequantize(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16,
               device: str | torch.device = "cpu") -> torch.Tensor:
    """blocks uint8 [E, N, G, 16], scales uint8 [E, N, G] -> [E, 32 G, N] in dtype on `device` (exact: each value
    is an FP4 value times a power of two). One expert at a time, so a 120B layer's experts never sit in float32 at
    once; each byte's two values are one lookup in a 256-row table."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"MXFP4 blocks and scales must be uint8, got {blocks.dtype} and {scales.dtype}")
    if blocks.dim() != 4 or blocks.shape[-1] != 16 or blocks.shape[:-1] != scales.shape:
        raise ValueError(f"MXFP4 blocks {tuple(blocks.shape)} and scales {tuple(scales.shape)}: expected "
                         "[E, N, G, 16] and [E, N, G]")
    fp4 = torch.tensor(FP4_VALUES, dtype=torch.float32, device=device)
    byte = torch.arange(256, device=device)
    pairs = torch.stack([fp4[byte & 0x0F], fp4[byte >> 4]], dim=-1)                 # [256, 2]: low nibble first
    E, N, G, _ = blocks.shape
    out = torch.empty(E, 32 * G, N, dtype=dtype, device=device)
    for e in range(E):
        codes = blocks[e].to(device).reshape(-1).int()
        values = pairs.index_select(0, codes).view(N, G, 32)                        # [N, G, 32]
        values.mul_(torch.exp2(scales[e].to(device).float() - 127.0)[..., None])
        out[e] = values.view(N, 32 * G).to(dtype).t()  # cast first: the transposed copy moves half the bytes
    return out


def join_packed(packed: dict[str, torch.Tensor], dtype: torch.dtype, device: str | torch.device = "cpu"
                ) -> dict[str, torch.Tensor]:
    """{"x_blocks": ..., "x_scales": ...} pairs -> {"x": dequantized on `device`}; a half without its other half is
    an error naming it."""
    stems = {name[: -len(s)] for name in packed for s in SUFFIXES if name.endswith(s)}
    lone = sorted(stem + s for stem in stems for s in SUFFIXES if stem + s not in packed)
    if lone:
        raise ValueError(f"MXFP4 tensors without their other half: {lone[:4]} missing")
    return {stem: dequantize(packed[stem + "_blocks"], packed[stem + "_scales"], dtype, device)
            for stem in sorted(stems)}
