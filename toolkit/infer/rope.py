"""RoPE as transformers 5 computes it for the Llama family and DeepSeek-V3: the parameters resolved from a
config.json in either spelling (5.x `rope_parameters`, 4.x `rope_scaling` + `rope_theta`), the inverse
frequencies and the attention factor cos/sin are scaled by, for rope types default, linear, dynamic, yarn,
longrope and llama3 (modeling_rope_utils.py).

Our frequencies are fixed. transformers' are too for all types but two, which it recomputes per forward from
the longest position seen: dynamic (past max_position_embeddings) and longrope (past
original_max_position_embeddings, where it swaps short_factor for long_factor). Up to that length both equal
the fixed ones; `exact_context` names it, and the engine refuses a longer context (ModelConfig.check_max_len).
"""
from __future__ import annotations

import math

import torch

from toolkit.infer.config_error import ConfigError

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")
_NEEDS = {"linear": ("factor",), "dynamic": ("factor",), "llama3": ("factor",),
          "longrope": ("short_factor", "long_factor")}  # keys without which transformers refuses the config


def resolve(cfg: dict, max_positions: int, partial_ok: bool = False) -> tuple[float, dict]:
    """(theta, parameters with "rope_type") from an HF text config, resolved as transformers resolves them:
    a truthy 4.x `rope_scaling` wins over `rope_parameters` (convert_rope_params_to_dict); theta from the
    dict, else the top-level `rope_theta`, else 10000; llama3 / yarn / longrope take a top-level
    `original_max_position_embeddings` over their own (standardize_rope_params), else default to
    max_position_embeddings. partial_ok: the family rotates part of each head (GLM-4.5: partial_rotary_factor,
    read by rotary_fraction), so any rope type may come with it."""
    rope = dict(cfg.get("rope_scaling") or cfg.get("rope_parameters") or {})
    theta = rope.pop("rope_theta", None)
    theta = float(theta if theta is not None else cfg.get("rope_theta") or 10000.0)
    kind = rope.pop("rope_type", None) or rope.get("type") or "default"
    rope.pop("type", None)
    rope["rope_type"] = kind
    if kind in ("llama3", "yarn", "longrope"):
        if cfg.get("original_max_position_embeddings") is not None:
            rope["original_max_position_embeddings"] = cfg["original_max_position_embeddings"]
        elif rope.get("original_max_position_embeddings") is None:
            rope["original_max_position_embeddings"] = max_positions
    partial = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor"))
    # transformers' Llama-family default rope ignores it; the scaled types shorten cos/sin and its forward fails
    if not partial_ok and kind != "default" and partial not in (None, 1, 1.0):
        raise ConfigError(f"partial_rotary_factor {partial} with rope type {kind!r}: transformers cannot run "
                          "this model either; accepted: 1.0 (or rope type 'default', which ignores it)")
    rope.pop("partial_rotary_factor", None)
    return theta, rope


def rotary_fraction(cfg: dict, default: float) -> float:
    """partial_rotary_factor: in rope_parameters (transformers 5) or at the top level (4.x), else `default`."""
    params = cfg.get("rope_parameters") or {}
    factor = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", default))
    if not 0 < float(factor) <= 1:
        raise ConfigError(f"partial_rotary_factor must be in (0, 1], got {factor}")
    return float(factor)


def validate(s: dict, d: int) -> None:
    """Refuse parameters transformers refuses, or that cannot give head_dim `d` frequencies."""
    kind = s.get("rope_type", "default")
    if kind not in ROPE_TYPES:
        raise ConfigError(f"rope type {kind!r} is not supported; accepted: {ROPE_TYPES}")
    missing = [k for k in _NEEDS.get(kind, ()) if s.get(k) is None]
    if kind == "yarn" and "factor" not in s:  # null is accepted: max_position_embeddings / the original
        missing.append("factor")
    if kind in ("llama3", "yarn", "longrope") and s.get("original_max_position_embeddings") is None:
        missing.append("original_max_position_embeddings")
    if missing:
        raise ConfigError(f"rope type {kind!r} needs {missing} in rope_parameters / rope_scaling")
    for key in ("short_factor", "long_factor") if kind == "longrope" else ():
        if len(s[key]) != d // 2:
            raise ConfigError(f"longrope {key} has {len(s[key])} entries; head_dim {d} needs {d // 2}")


def inv_freq(d: int, theta: float, s: dict, max_positions: int) -> torch.Tensor:
    """Inverse frequencies float32[d // 2]: float32 arithmetic, exactly as transformers computes them (and
    the model was trained with). dynamic and longrope give those transformers uses up to exact_context."""
    kind = s["rope_type"]
    if kind == "yarn":
        return _yarn(d, theta, s, scale_factor(s, max_positions))
    if kind == "dynamic":  # its base at a sequence of max_position_embeddings: theta (times 1.0)
        f = s["factor"]
        theta = theta * ((f * max_positions / max_positions) - (f - 1)) ** (d / (d - 2))
    powers = theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d)
    inv = 1.0 / powers
    if kind == "linear":
        return inv / s["factor"]
    if kind == "llama3":
        return _llama3(inv, s)
    if kind == "longrope":  # short_factor: transformers' frequencies up to original_max_position_embeddings
        return 1.0 / (torch.tensor(s["short_factor"], dtype=torch.float32) * powers)
    return inv


def attention_factor(s: dict, max_positions: int) -> float:
    """What cos and sin are multiplied by: yarn's and longrope's attention factor (given, else derived from
    the scale factor as transformers derives it), 1 for the other types."""
    kind = s["rope_type"]
    if kind not in ("yarn", "longrope"):
        return 1.0
    if s.get("attention_factor") is not None:
        return float(s["attention_factor"])
    factor = scale_factor(s, max_positions)
    if kind == "longrope":
        old = s["original_max_position_embeddings"]
        return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(old))
    if s.get("mscale") and s.get("mscale_all_dim"):
        return mscale(factor, s["mscale"]) / mscale(factor, s["mscale_all_dim"])
    return mscale(factor)


def exact_context(s: dict, max_positions: int) -> tuple[int | None, str]:
    """(the longest context fixed frequencies reproduce transformers for, why), or (None, "") for any."""
    kind = s["rope_type"]
    if kind == "dynamic":
        return max_positions, (f"max_position_embeddings {max_positions} of the model's dynamic rope scaling: "
                               "transformers rescales the frequencies past it, which this engine does not")
    if kind == "longrope":
        old = s["original_max_position_embeddings"]
        return old, (f"original_max_position_embeddings {old} of the model's longrope scaling: transformers "
                     "switches to long_factor past it, which this engine does not")
    return None, ""


def mscale(scale: float, m: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def scale_factor(s: dict, max_positions: int) -> float:
    """`factor`, or when absent max_position_embeddings / original_max_position_embeddings (transformers)."""
    return s.get("factor") or max_positions / s["original_max_position_embeddings"]


def _llama3(inv: torch.Tensor, s: dict) -> torch.Tensor:
    """Llama 3.1: low frequencies divided by factor, high ones kept, a smooth blend between."""
    factor, low, high = s["factor"], s.get("low_freq_factor", 1.0), s.get("high_freq_factor", 4.0)
    old = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old / high) & (wavelen <= old / low)
    return torch.where(medium, smoothed, scaled)


def _yarn(d: int, theta: float, s: dict, factor: float) -> torch.Tensor:
    """YaRN: interpolated frequencies below a ramp over the dims, the original ones above (as transformers)."""
    old = s["original_max_position_embeddings"]
    fast, slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1

    def dim_of(rotations):  # the dim whose wavelength makes `rotations` turns over the original context
        return d * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_of(fast), dim_of(slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: extrapolate (the original frequency), 0: interpolate (divided by factor)
    base = theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d)  # the same float32 ops as transformers
    return 1.0 / (factor * base) * (1 - keep) + 1.0 / base * keep
