"""FP8 checkpoints (`quantization_config.quant_method: fp8`: DeepSeek-V3 / R1 and Kimi-K2 as released, Qwen3's -FP8
models, AutoFP8's per-tensor exports; `compressed-tensors` whose weight schemes are all 8-bit floats: llm-compressor's
FP8 exports, per tensor, per channel or in blocks), dequantized on load to the model's dtype. A quantized
Linear weight W [N, K] is stored as two tensors:

    {name}.weight            float8_e4m3fn (or e5m2) [N, K]
    {name}.weight_scale_inv  float32 [ceil(N / bn), ceil(K / bk)] with `weight_block_size: [bn, bk]`
                             (DeepSeek's name: the scale the weight is multiplied by, despite "inv"), or
    {name}.weight_scale      float32 [] / [1] per tensor, or [N] / [N, 1] per output row (AutoFP8's)

    W[i, j] = weight[i, j] * scale[i // bn, j // bk]     (in float32, then rounded to the model's dtype)

as transformers' Fp8Dequantize and DeepSeek's weight_dequant compute it; E8M0 scales (uint8, 2^(s - 127)) are read
too. `fbgemm_fp8` (Meta's Llama 4 Maverick FP8, transformers' FbgemmFp8Linear) stores a Linear weight with a
per-row `weight_scale` [N, 1] as above, and Llama 4's stacked experts with scales of their own name:

    {l}.experts.gate_up_proj        float8 [E, H, 2I]    {l}.experts.gate_up_proj_scale  float32 [E, 1, 2I]
    {l}.experts.down_proj           float8 [E, I, H]     {l}.experts.down_proj_scale     float32 [E, H, 1]

    W[e, k, n] = weight[e, k, n] * scale[e, 0, n]  (gate_up)     W[e, i, h] = weight[e, i, h] * scale[e, h, 0]  (down)
 A static scheme's `input_scale` (the activations' FP8 scale) and an FP8 KV cache's `k_scale` / `v_scale` have no
use once the weights are dequantized (the engine keeps activations and its cache in the model's dtype) and are
skipped. Tensors stored unquantized (norms, embeddings, routers, `modules_to_not_convert`) load as they are.
"""
from __future__ import annotations

import torch

SCALES = (".weight_scale_inv", ".weight_scale")
EXPERT_SCALES = ("experts.gate_up_proj_scale", "experts.down_proj_scale")  # fbgemm_fp8's stacked experts' scales
SKIPPED = (".input_scale", ".input_scale_ub", ".activation_scale", ".k_scale", ".v_scale")  # activations' / KV's
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def quantization(cfg: dict) -> dict:
    """A config.json's quantization_config (its text_config's, or the top level's), {} without one."""
    return cfg.get("text_config", cfg).get("quantization_config") or cfg.get("quantization_config") or {}


def compressed_fp8(q: dict) -> list[dict]:
    """compressed-tensors' weight schemes when every group quantizes weights to 8-bit floats (its float-quantized
    format: vLLM's FP8 checkpoints, e.g. RedHat's -FP8-dynamic), else [] (int4 / int8 / FP4 schemes)."""
    if q.get("quant_method") != "compressed-tensors":
        return []
    groups = [g.get("weights") or {} for g in (q.get("config_groups") or {}).values()]
    ok = groups and all(w.get("num_bits") == 8 and w.get("type") == "float" for w in groups)
    return groups if ok else []


def supported(q: dict) -> bool:
    """Whether a quantization_config is one this module dequantizes: fp8, fbgemm_fp8, or compressed-tensors' FP8
    weights."""
    return q.get("quant_method") in ("fp8", "fbgemm_fp8") or bool(compressed_fp8(q))


def block_size(cfg: dict) -> tuple[int, int] | None:
    """A config.json's FP8 weight blocks ([bn, bk]: `weight_block_size`, or compressed-tensors' `block_structure`
    under strategy block), None without (per-tensor or per-row scales)."""
    q = quantization(cfg)
    size = q.get("weight_block_size")
    for w in compressed_fp8(q):
        if w.get("strategy") == "block":
            size = w.get("block_structure")
    if size is None:
        return None
    if len(size) != 2 or any(int(s) <= 0 for s in size):
        raise ValueError(f"quantization_config's weight block size {size}: expected two positive sizes [bn, bk]")
    return int(size[0]), int(size[1])


def is_fp8(cfg: dict) -> bool:
    return supported(quantization(cfg))


def kind(sf, key: str) -> str | None:
    """What tensor `key` of an open safetensors file `sf` of an FP8 checkpoint is: "scale" (a weight's), "skip" (an
    activation scale), "fp8" (a quantized weight: read its dtype from the header, not the data), or None."""
    if key.endswith(SCALES + EXPERT_SCALES):
        return "scale"
    if key.endswith(SKIPPED):
        return "skip"
    return "fp8" if sf.get_slice(key).get_dtype() in ("F8_E4M3", "F8_E5M2") else None


class Pending:
    """An FP8 checkpoint's quantized weights and their scales, kept while its files are read (a weight's scale may
    sit in another shard) and dequantized together once all are (loading.py, mtp.py, train/head.py read them so)."""

    def __init__(self, cfg: dict):
        self.on = is_fp8(cfg)
        self.block = block_size(cfg) if self.on else None
        self.weights: dict[str, torch.Tensor] = {}
        self.scales: dict[str, torch.Tensor] = {}

    def take(self, sf, key: str, name: str | None = None) -> bool:
        """True when tensor `key` of the open file `sf` is this module's: an FP8 weight or a weight's scale, kept
        under `name` (default the key), or an activation's scale, dropped; False for a tensor stored as it is."""
        what = kind(sf, key) if self.on else None
        if what is None:
            return False
        if what != "skip":
            (self.scales if what == "scale" else self.weights)[name or key] = sf.get_tensor(key)
        return True

    def dequantized(self, dtype: torch.dtype, where: str) -> dict[str, torch.Tensor]:
        return join(self.weights, self.scales, self.block, dtype, where)


def dequantize(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None, dtype: torch.dtype,
               name: str = "weight") -> torch.Tensor:
    """weight float8 [N, K] (or [..., N, K]) and its scale -> [N, K] in dtype. A scale of no shape that fits is
    refused with both shapes named."""
    if weight.dtype not in FP8_DTYPES:
        raise ValueError(f"{name}: an FP8 scale beside a {weight.dtype} weight; expected float8_e4m3fn / e5m2")
    s = (scale.float() - 127.0).exp2() if scale.dtype == torch.uint8 else scale.float()
    w = weight.float()
    N, K = w.shape[-2:]
    if s.numel() == 1:
        return (w * s.reshape(())).to(dtype)
    if block is not None and s.dim() == w.dim() and s.shape[-2:] == (-(-N // block[0]), -(-K // block[1])):
        s = s.repeat_interleave(block[0], -2)[..., :N, :].repeat_interleave(block[1], -1)[..., :K]
        return (w * s).to(dtype)
    if s.shape in ((N,), (N, 1)):  # per output row
        return (w * s.reshape(N, 1)).to(dtype)
    if w.dim() == 3 and s.shape == (w.shape[0], 1, K):  # fbgemm's stacked gate_up_proj [E, H, 2I]: per column
        return (w * s).to(dtype)
    if w.dim() == 3 and s.shape == (w.shape[0], K, 1):  # fbgemm's stacked down_proj [E, I, H]: per column
        return (w * s.transpose(1, 2)).to(dtype)
    raise ValueError(f"{name}: FP8 scale {tuple(scale.shape)} fits neither the weight {tuple(weight.shape)} in "
                     f"blocks {block} nor per tensor / per row")


def join(weights: dict[str, torch.Tensor], scales: dict[str, torch.Tensor], block: tuple[int, int] | None,
         dtype: torch.dtype, where: str) -> dict[str, torch.Tensor]:
    """Every FP8 weight ({name}.weight) dequantized with its scale ({name}.weight_scale_inv or .weight_scale),
    each taken out of `weights` as it is (its FP8 copy freed: the FP8 and the dequantized weights are never both
    whole in memory); a weight without a scale or a scale without a weight is refused by name."""
    out, used = {}, set()
    for name in list(weights):
        w = weights.pop(name)
        base = name.removesuffix(".weight")
        names = [base + s for s in SCALES] if name.endswith(".weight") else [name + "_scale"]  # fbgemm's experts
        key = next((k for k in names if k in scales), None)
        if key is None:
            raise ValueError(f"{where}: FP8 weight {name} has no {' / '.join(names)} beside it")
        out[name] = dequantize(w, scales[key], block, dtype, name)
        used.add(key)
    if extra := sorted(scales.keys() - used):
        raise ValueError(f"{where}: FP8 scales without their weights: {extra[:4]}")
    return out
