"""Target model configuration: the Llama family (Llama 2/3/3.1, Mistral, Qwen2/2.5, Qwen3, Phi-3/4, SmolLM2),
its MoE kin (Mixtral, Qwen2-MoE, Qwen3-MoE, GLM-4.5, GPT-OSS: moe_config.py, moe.py, gpt_oss.py), DeepSeek-V3 /
Kimi-K2 (MLA attention: deepseek.py; MoE MLPs), Gemma 2 / 3 (gemma_config.py, gemma.py) and Llama 4
(llama4_config.py, llama4.py), read from an HF config.json (transformers 4.x or 5.x spelling; what each
model_type fixes: families.py; some families' own keys: family_keys.py), validated on construction."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from toolkit.infer import family_keys, fp8, rope
from toolkit.infer.config_error import ConfigError, check_sizes
from toolkit.infer.families import ACTIVATIONS, FAMILIES, MLA, MLA_KINDS, PARTIAL_ROPE, mla_from_hf
from toolkit.infer.gemma_config import GEMMA_KINDS, Gemma, gemma_from_hf, gemma_rope
from toolkit.infer.llama4_config import Llama4, llama4_from_hf
from toolkit.infer.moe_config import MoE, moe_from_hf
from toolkit.json_files import read_json


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
    moe: MoE | None = None        # MoE MLPs in the layers moe.sparse() names
    sliding_window: int | None = None  # the HF model's attention window (Mistral, Qwen2/3); None: full attention
    full_layers: tuple[int, ...] = ()  # with a window: the layers that still attend over the whole context
    rotary_dim: int | None = None  # RoPE on the first rotary_dim dims of each head (GLM-4.5); None: all head_dim
    attention_sinks: bool = False  # a learned logit per query head joins each softmax, its value zero (GPT-OSS)
    norm_fp32_product: bool = False  # RMSNorm scaled in fp32 then rounded (GPT-OSS), not rounded then scaled
    gemma: Gemma | None = None    # Gemma 2 / 3's layer (gemma.py): None for every other family
    llama4: Llama4 | None = None  # Llama 4's NoPE / chunked layers (llama4.py): None for every other family

    def __post_init__(self):
        if self.model_type not in FAMILIES:
            raise ConfigError(f"model_type {self.model_type!r} is not supported; accepted: {sorted(FAMILIES)}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim"):
            value = getattr(self, name)  # a null or a string in config.json: a TypeError deep in a forward
            if type(value) is not int or value <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"num_attention_heads {self.num_heads} is not a multiple of num_key_value_heads "
                              f"{self.num_kv_heads}")
        if self.rotary_dim is not None and not (0 < self.rotary_dim <= self.head_dim and self.rotary_dim % 2 == 0):
            raise ConfigError(f"rotary dims {self.rotary_dim} (head_dim x partial_rotary_factor) must be even and in "
                              f"1..head_dim {self.head_dim}")
        rope.validate(self.rope_scaling, self.rope_dim)
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise ConfigError(f"sliding_window must be positive or null, got {self.sliding_window}")

    def context_limit(self) -> tuple[int | None, str]:
        """(the longest context this engine reproduces transformers for, why), or (None, "") for any: rope types
        whose frequencies change with the length (rope.py)."""
        return rope.exact_context(self.rope_scaling_or_default, self.max_position_embeddings)

    def slides(self, layer: int) -> bool:
        """Whether decoder layer `layer` attends only to the last sliding_window positions (its own included)."""
        return self.sliding_window is not None and layer not in self.full_layers

    @property
    def llama_layers(self) -> bool:
        """Whether the Llama layer's pieces run this model (the Triton kernels, the compiled CPU step, MTP blocks
        do): not DeepSeek's MLA, Gemma's or Llama 4's layers."""
        return self.mla is None and self.gemma is None and self.llama4 is None

    def attends_locally(self, layer: int) -> bool:
        """Whether layer `layer` sees only part of the context: a sliding window, or Llama 4's chunk."""
        return self.slides(layer) or (self.llama4 is not None and self.llama4.chunked(layer))

    def check_max_len(self, max_len: int) -> None:
        """Refuse an engine context (KV cache length) longer than context_limit."""
        limit, why = self.context_limit()
        if limit is not None and max_len > limit:
            raise ConfigError(f"max_len {max_len} exceeds {why}; use --max-len <= {limit}")

    def check_sequence(self, tokens: int) -> None:
        """Refuse a forward without a KV cache (training, evaluation) over more tokens than context_limit."""
        limit, why = self.context_limit()
        if limit is not None and tokens > limit:
            raise ConfigError(f"a sequence of {tokens} tokens exceeds {why}; keep sequences to <= {limit} tokens")

    @property
    def rope_scaling_or_default(self) -> dict:
        """rope_scaling with its type spelled out (a config built in code may leave it out)."""
        return {"rope_type": "default", **self.rope_scaling}

    @property
    def cache_dims(self) -> tuple[int, int, int]:
        """(cached heads, key dim, value dim) per token and layer: MLA caches every head's expanded k and v."""
        if self.mla is not None:
            m = self.mla
            return self.num_heads, m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim
        return self.num_kv_heads, self.head_dim, self.head_dim

    @classmethod
    def from_hf(cls, cfg: dict) -> "ModelConfig":
        """From an HF config.json (its text_config if any), with transformers' defaults for absent keys; a key
        transformers honours and this engine cannot is refused by name."""
        if not isinstance(cfg, dict) or not isinstance(cfg.get("text_config", cfg), dict):
            raise ConfigError(f"config.json holds {type(cfg).__name__} {str(cfg)[:40]}, not a JSON object of the "
                              "model's settings")
        outer, cfg = cfg, cfg.get("text_config", cfg)
        kind = cfg.get("model_type")
        if kind not in FAMILIES:
            raise ConfigError(f"model_type {kind!r} is not supported; accepted: {sorted(FAMILIES)}")
        # a multimodal config's quantization_config sits at its top level
        _refuse_unsupported(kind, {**cfg, "quantization_config": fp8.quantization(outer) or None})
        cfg = family_keys.text_config(outer)  # with the keys a multimodal text_config leaves at their defaults
        check_sizes(kind, cfg)
        family, heads = FAMILIES[kind], cfg["num_attention_heads"]
        max_positions = cfg.get("max_position_embeddings") or family.max_positions
        if kind == "phi3":
            cfg = family_keys.phi3_rope(cfg)
        elif kind == "gpt_oss":
            cfg = family_keys.gpt_oss_rope(cfg)
        cfg, local_theta = gemma_rope(kind, cfg)
        theta, rope_params = rope.resolve(cfg, max_positions, partial_ok=kind in PARTIAL_ROPE)
        mla, moe = None, moe_from_hf(kind, cfg)
        if kind in MLA_KINDS:
            mla = mla_from_hf(cfg)
            cfg = {**cfg, "head_dim": mla.qk_rope_head_dim}
        attention_bias = family.attention_bias and bool(cfg.get("attention_bias", family.attention_bias_default))
        qkv_bias = {"qwen2_moe": bool(cfg.get("qkv_bias", True)),
                    "glm4_moe": bool(cfg.get("attention_bias", False))}.get(kind, family.qkv_bias)
        head_dim = cfg.get("head_dim") or family.head_dim or cfg["hidden_size"] // heads
        rotary_dim = int(head_dim * rope.rotary_fraction(cfg, PARTIAL_ROPE[kind])) if kind in PARTIAL_ROPE else None
        return cls(
            model_type=kind, vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
            intermediate_size=cfg.get("intermediate_size_mlp", 16384) if kind == "llama4_text" else
            cfg["intermediate_size"], num_layers=cfg["num_hidden_layers"], num_heads=heads,
            # null: one per query head (transformers' rule); absent: the config class's default
            num_kv_heads=heads if "num_key_value_heads" in cfg and cfg["num_key_value_heads"] is None
            else cfg.get("num_key_value_heads") or family.kv_heads or heads,
            head_dim=head_dim, rotary_dim=None if rotary_dim == head_dim else rotary_dim,
            rms_norm_eps=cfg.get("rms_norm_eps", family.rms_norm_eps), rope_theta=theta, rope_scaling=rope_params,
            max_position_embeddings=max_positions,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", kind in GEMMA_KINDS)),
            qkv_bias=qkv_bias or attention_bias,
            qk_norm=bool(cfg.get("use_qk_norm", False)) if kind == "glm4_moe" else family.qk_norm,
            attention_bias=attention_bias, mla=mla, moe=moe, attention_sinks=kind == "gpt_oss",
            norm_fp32_product=kind == "gpt_oss",
            gemma=gemma_from_hf(kind, cfg, local_theta, outer.get("model_type") == "gemma3")
            if kind in GEMMA_KINDS else None,
            llama4=llama4_from_hf(cfg) if kind == "llama4_text" else None,
            **family_keys.sliding_window(kind, cfg))

    @classmethod
    def from_folder(cls, folder: str | Path, raw: dict | None = None) -> "ModelConfig":
        """From folder/config.json; raw: that file as the caller has read it already (not read again)."""
        try:
            return cls.from_hf(read_json(Path(folder) / "config.json") if raw is None else raw)
        except ConfigError as e:
            raise ConfigError(f"{Path(folder) / 'config.json'}: {e}") from None

    def default_aux_layers(self) -> list[int]:
        """EAGLE-3's low/mid/high layers (their outputs): [1, L//2 - 1, L - 4] (SGLang/SpecForge default)."""
        n = self.num_layers
        return [1, n // 2 - 1, n - 4] if n >= 5 else [0, n // 2, n - 1]

    @property
    def rope_dim(self) -> int:
        """The dims of each head RoPE rotates (the first ones)."""
        return self.rotary_dim or self.head_dim

    def inv_freq(self) -> torch.Tensor:
        """RoPE inverse frequencies float32[rope_dim // 2], scaled as the rope type says (rope.py)."""
        return rope.inv_freq(self.rope_dim, self.rope_theta, self.rope_scaling_or_default,
                             self.max_position_embeddings)

    def local_inv_freq(self) -> torch.Tensor | None:
        """Gemma 3's sliding layers' RoPE frequencies (default rope of their own base), or None: one RoPE for all."""
        if self.gemma is None or self.gemma.local_rope_theta is None:
            return None
        return rope.inv_freq(self.rope_dim, self.gemma.local_rope_theta, {"rope_type": "default"},
                             self.max_position_embeddings)

    def rope_attention_factor(self) -> float:
        """What cos and sin are multiplied by (yarn's and longrope's attention factor; 1 otherwise)."""
        return rope.attention_factor(self.rope_scaling_or_default, self.max_position_embeddings)

    def softmax_mscale(self) -> float:
        """What DeepSeek's softmax scale is multiplied by: mscale(factor, mscale_all_dim)^2 under any scaled
        rope type with mscale_all_dim (transformers' yarn_apply_mscale), else 1."""
        s = self.rope_scaling_or_default
        if s["rope_type"] == "default" or not s.get("mscale_all_dim"):
            return 1.0
        return rope.mscale(rope.scale_factor(s, self.max_position_embeddings), s["mscale_all_dim"]) ** 2


def _refuse_unsupported(kind: str, cfg: dict) -> None:
    """Keys transformers honours that change the math and this engine does not implement."""
    quant = (cfg.get("quantization_config") or {}).get("quant_method")
    if (kind == "gpt_oss" and quant == "mxfp4") or fp8.supported(cfg.get("quantization_config") or {}):
        pass  # dequantized on load (mxfp4.py, fp8.py)
    elif cfg.get("quantization_config"):
        raise ConfigError(f"a quantized checkpoint (quantization_config: {quant}) is not supported; accepted: fp8, "
                          "fbgemm_fp8 and compressed-tensors with 8-bit float weights (dequantized on load), gpt-oss's "
                          "mxfp4; "
                          "dequantize it to bf16 first")
    act = cfg.get("hidden_act", "silu")
    if kind not in GEMMA_KINDS and act not in ACTIVATIONS:  # Gemma's is `hidden_activation` (gemma_config.py)
        raise ConfigError(f"hidden_act {act!r} is not supported; accepted: {ACTIVATIONS}")
    if kind == "llama" and cfg.get("mlp_bias"):  # the one family whose MLP transformers gives biases
        raise ConfigError("mlp_bias true (biased gate/up/down projections) is not supported; accepted: false")
