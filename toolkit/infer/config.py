"""Target model configuration: the Llama family (Llama 2/3/3.1, Mistral, Qwen2/2.5, Qwen3, SmolLM2) read from
an HF config.json (transformers 4.x or 5.x spelling), validated on construction."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

FAMILIES = {  # model_type -> (q/k/v bias, per-head q/k RMSNorm)
    "llama": (False, False),
    "mistral": (False, False),
    "qwen2": (True, False),
    "qwen3": (False, True),
    "mimo": (True, False),  # Xiaomi MiMo: a Qwen2 body plus MTP layers (toolkit/infer/mtp.py)
}
ROPE_TYPES = ("default", "linear", "llama3")


class ConfigError(ValueError):
    """A config.json this engine cannot run; the message names the field and what is accepted."""


@dataclass
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict = field(default_factory=dict)  # {"rope_type": ..., "factor": ..., ...}
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    attention_bias: bool = False  # o_proj bias (Llama `attention_bias` puts it on q/k/v/o alike)

    def __post_init__(self):
        if self.model_type not in FAMILIES:
            raise ConfigError(f"model_type {self.model_type!r} is not supported; accepted: {sorted(FAMILIES)}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"num_attention_heads {self.num_heads} is not a multiple of num_key_value_heads "
                              f"{self.num_kv_heads}")
        kind = self.rope_scaling.get("rope_type", "default")
        if kind not in ROPE_TYPES:
            raise ConfigError(f"rope type {kind!r} is not supported; accepted: {ROPE_TYPES}")

    @classmethod
    def from_hf(cls, cfg: dict) -> "ModelConfig":
        cfg = cfg.get("text_config", cfg)
        kind = cfg.get("model_type")
        if kind not in FAMILIES:
            raise ConfigError(f"model_type {kind!r} is not supported; accepted: {sorted(FAMILIES)}")
        rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})  # 5.x, then 4.x spelling
        theta = rope.pop("rope_theta", cfg.get("rope_theta", 10000.0))
        rope.setdefault("rope_type", rope.pop("type", "default"))
        bias, qk_norm = FAMILIES[kind]
        heads = cfg["num_attention_heads"]
        return cls(
            model_type=kind, vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"], num_layers=cfg["num_hidden_layers"], num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6), rope_theta=float(theta), rope_scaling=rope,
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=bias or bool(cfg.get("attention_bias", False)), qk_norm=qk_norm,
            attention_bias=bool(cfg.get("attention_bias", False)))

    @classmethod
    def from_folder(cls, folder: str | Path) -> "ModelConfig":
        return cls.from_hf(json.loads((Path(folder) / "config.json").read_text()))

    def default_aux_layers(self) -> list[int]:
        """EAGLE-3's low/mid/high layers (their outputs): [1, L//2 - 1, L - 4] (SGLang/SpecForge default)."""
        n = self.num_layers
        return [1, n // 2 - 1, n - 4] if n >= 5 else [0, n // 2, n - 1]

    def inv_freq(self) -> torch.Tensor:
        """RoPE inverse frequencies float32[head_dim // 2], with linear or Llama-3.1 scaling applied."""
        d = self.head_dim  # float32 arithmetic, exactly as transformers computes it (and trained with it)
        inv = 1.0 / (self.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
        kind, s = self.rope_scaling.get("rope_type", "default"), self.rope_scaling
        if kind == "linear":
            inv = inv / s["factor"]
        elif kind == "llama3":
            factor, low, high = s["factor"], s.get("low_freq_factor", 1.0), s.get("high_freq_factor", 4.0)
            old = s.get("original_max_position_embeddings", 8192)
            wavelen = 2 * math.pi / inv
            scaled = torch.where(wavelen > old / low, inv / factor, inv)
            smooth = (old / wavelen - low) / (high - low)
            smoothed = (1 - smooth) * scaled / factor + smooth * scaled
            medium = (wavelen >= old / high) & (wavelen <= old / low)
            inv = torch.where(medium, smoothed, scaled)
        return inv
