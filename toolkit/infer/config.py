"""Target model configuration: the Llama family (Llama 2/3/3.1, Mistral, Qwen2/2.5, Qwen3, SmolLM2) and
DeepSeek-V3 (MLA attention, MoE MLPs: toolkit/infer/deepseek.py) read from an HF config.json (transformers 4.x
or 5.x spelling), validated on construction."""
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
    "deepseek_v3": (False, False),  # MLA + MoE (toolkit/infer/deepseek.py), NextN MTP layers
}
ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True)
class MLA:
    """DeepSeek multi-head latent attention sizes (the HF config's names)."""
    q_lora_rank: int | None     # None: a plain q_proj
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleave: bool = True  # rotary dims paired (x0, x1), (x2, x3), ... as DeepSeek's weights are laid out


@dataclass(frozen=True)
class MoE:
    """DeepSeek-V3 mixture of experts: sigmoid scores, group-limited top-k, shared experts."""
    num_experts: int
    top_k: int
    n_group: int
    topk_group: int
    intermediate_size: int      # per expert
    n_shared_experts: int
    first_dense: int            # layers below this index keep a dense MLP (first_k_dense_replace)
    routed_scaling_factor: float = 1.0
    norm_topk_prob: bool = True

    def __post_init__(self):
        if self.num_experts % self.n_group or not 1 <= self.topk_group <= self.n_group:
            raise ConfigError(f"MoE: n_routed_experts {self.num_experts} must split into n_group {self.n_group} "
                              f"groups and topk_group {self.topk_group} must be in 1..n_group")
        if not 1 <= self.top_k <= self.num_experts // self.n_group * self.topk_group:
            raise ConfigError(f"MoE: num_experts_per_tok {self.top_k} exceeds the experts of topk_group groups")


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
    mla: MLA | None = None        # DeepSeek attention (head_dim is then the rotary dims, qk_rope_head_dim)
    moe: MoE | None = None        # DeepSeek MoE MLPs from layer moe.first_dense on
    sliding_window: int | None = None  # the HF model's attention window (Mistral, Qwen2/3); None: full attention

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
        if kind == "yarn" and "original_max_position_embeddings" not in self.rope_scaling:
            raise ConfigError("yarn rope scaling needs original_max_position_embeddings")
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise ConfigError(f"sliding_window must be positive or null, got {self.sliding_window}")

    def check_max_len(self, max_len: int) -> None:
        """Refuse a context longer than the model's sliding window: the engine attends over the full context,
        which matches the model only while every query sees at most `sliding_window` tokens."""
        if self.sliding_window is not None and max_len > self.sliding_window:
            raise ConfigError(f"max_len {max_len} exceeds the model's sliding_window {self.sliding_window}: the "
                              f"engine attends over the full context; use --max-len <= {self.sliding_window}")

    @property
    def cache_dims(self) -> tuple[int, int, int]:
        """(cached heads, key dim, value dim) per token and layer: MLA caches every head's expanded k and v."""
        if self.mla is not None:
            m = self.mla
            return self.num_heads, m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim
        return self.num_kv_heads, self.head_dim, self.head_dim

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
        mla = moe = None
        if kind == "deepseek_v3":
            mla, moe = _deepseek(cfg)
            cfg = {**cfg, "head_dim": mla.qk_rope_head_dim}
        return cls(
            model_type=kind, vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"], num_layers=cfg["num_hidden_layers"], num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6), rope_theta=float(theta), rope_scaling=rope,
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=bias or bool(cfg.get("attention_bias", False)), qk_norm=qk_norm,
            attention_bias=bool(cfg.get("attention_bias", False)), mla=mla, moe=moe,
            sliding_window=_sliding_window(kind, cfg))

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
        elif kind == "yarn":
            inv = _yarn(d, self.rope_theta, s)
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

    def rope_attention_factor(self) -> float:
        """What cos and sin are multiplied by (yarn's attention factor; 1 otherwise), as transformers does."""
        s = self.rope_scaling
        if s.get("rope_type", "default") != "yarn":
            return 1.0
        if s.get("attention_factor") is not None:
            return float(s["attention_factor"])
        factor = _yarn_factor(s, self.max_position_embeddings)
        if s.get("mscale") and s.get("mscale_all_dim"):
            return _mscale(factor, s["mscale"]) / _mscale(factor, s["mscale_all_dim"])
        return _mscale(factor)

    def softmax_mscale(self) -> float:
        """What DeepSeek's softmax scale is multiplied by: mscale(factor, mscale_all_dim)^2 under yarn, else 1."""
        s = self.rope_scaling
        if s.get("rope_type", "default") != "yarn" or not s.get("mscale_all_dim"):
            return 1.0
        return _mscale(_yarn_factor(s, self.max_position_embeddings), s["mscale_all_dim"]) ** 2


def _sliding_window(kind: str, cfg: dict) -> int | None:
    """The window transformers applies: Mistral's `sliding_window` (default 4096, null = off); Qwen2/3's only
    with `use_sliding_window`, and only if some layer slides (layer_types, else layers >= max_window_layers)."""
    if kind in ("qwen2", "qwen3", "mimo"):
        if not cfg.get("use_sliding_window"):
            return None
    elif kind != "mistral":
        return None
    window = cfg.get("sliding_window", 4096)
    if window is None:
        return None
    if cfg.get("layer_types") is not None:
        slides = "sliding_attention" in cfg["layer_types"]
    else:
        slides = kind == "mistral" or cfg.get("max_window_layers", 28) < cfg["num_hidden_layers"]
    return int(window) if slides else None


def _mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_factor(s: dict, max_positions: int) -> float:
    return s.get("factor") or max_positions / s["original_max_position_embeddings"]


def _yarn(d: int, theta: float, s: dict) -> torch.Tensor:
    """YaRN: interpolated frequencies below a ramp over the dims, the original ones above (as transformers)."""
    factor, old = s["factor"], s["original_max_position_embeddings"]
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


def _deepseek(cfg: dict) -> tuple[MLA, MoE]:
    if cfg.get("quantization_config"):
        raise ConfigError(f"a quantized DeepSeek checkpoint ({cfg['quantization_config'].get('quant_method')}) "
                          "is not supported: dequantize it to bf16 first")
    if cfg.get("scoring_func", "sigmoid") != "sigmoid" or cfg.get("topk_method", "noaux_tc") != "noaux_tc":
        raise ConfigError("DeepSeek MoE routing: accepted scoring_func sigmoid with topk_method noaux_tc "
                          "(DeepSeek-V3); got " + f"{cfg.get('scoring_func')}/{cfg.get('topk_method')}")
    mla = MLA(cfg.get("q_lora_rank"), cfg["kv_lora_rank"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"],
              cfg["v_head_dim"], bool(cfg.get("rope_interleave", True)))
    moe = MoE(cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg.get("n_group") or 1,
              cfg.get("topk_group") or 1, cfg["moe_intermediate_size"], cfg.get("n_shared_experts") or 0,
              cfg.get("first_k_dense_replace", 0), float(cfg.get("routed_scaling_factor", 1.0)),
              bool(cfg.get("norm_topk_prob", True)))
    return mla, moe
