"""What transformers fixes or defaults per model_type for a config.json (ModelConfig.from_hf reads it), and DeepSeek's
multi-head latent attention sizes."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class Family(NamedTuple):
    """What transformers' modeling and config classes of a model_type fix, or default, for its config.json."""
    qkv_bias: bool             # q/k/v always biased (Qwen2)
    qk_norm: bool              # per-head q/k RMSNorm (Qwen3)
    attention_bias: bool       # honours `attention_bias` (Mistral's and Qwen2's modeling ignore the key)
    max_positions: int         # the config class's max_position_embeddings default
    head_dim: int | None = None  # the config class's head_dim default (None: hidden_size // heads)
    kv_heads: int | None = None  # the config class's num_key_value_heads default (None: the query heads)
    rms_norm_eps: float = 1e-6   # the config class's rms_norm_eps default
    attention_bias_default: bool = False  # the config class's attention_bias default


FAMILIES = {
    "llama": Family(False, False, True, 2048),
    "mistral": Family(False, False, False, 131072, kv_heads=8),
    "qwen2": Family(True, False, False, 32768, kv_heads=32),
    "qwen3": Family(False, True, True, 32768, head_dim=128, kv_heads=32),
    "mimo": Family(True, False, False, 32768, kv_heads=32),  # Xiaomi MiMo: a Qwen2 body plus MTP layers (mtp.py)
    "deepseek_v3": Family(False, False, True, 4096),  # MLA + MoE (toolkit/infer/deepseek.py), NextN MTP layers
    "kimi_k2": Family(False, False, True, 4096),  # Kimi-K2: DeepSeek-V3's architecture under its own model_type
    "mixtral": Family(False, False, False, 131072, kv_heads=8, rms_norm_eps=1e-5),  # Mistral's attention, MoE MLPs
    "qwen2_moe": Family(True, False, False, 32768, kv_heads=16),  # qkv biases per `qkv_bias` (default true)
    "qwen3_moe": Family(False, True, True, 32768, kv_heads=4),
    # GLM-4.5 / 4.6: q/k/v biases per `attention_bias` (o_proj never), q/k norms per `use_qk_norm`, RoPE on the
    # first partial_rotary_factor (default 0.5) of each head, DeepSeek's MoE, NextN MTP layers
    "glm4_moe": Family(False, False, False, 131072, kv_heads=8, rms_norm_eps=1e-5),
    # Phi-3 / 3.5 / Phi-4 / Phi-4-mini: fused qkv_proj and gate_up_proj on disk (hf_names.py), RoPE on the first
    # partial_rotary_factor (default 1) of each head, longrope ("su" / "yarn" in old configs)
    "phi3": Family(False, False, False, 4096, rms_norm_eps=1e-5),
    # GPT-OSS: q/k/v/o biases, attention sinks, sliding and full layers alternating, clamped-SwiGLU experts with
    # biases and a biased router (gpt_oss.py); MXFP4 experts on disk are dequantized on load (mxfp4.py)
    "gpt_oss": Family(False, False, True, 131072, head_dim=64, kv_heads=8, rms_norm_eps=1e-5,
                      attention_bias_default=True),
    # Gemma 2 / 3: scaled embedding, (1 + w) sandwich norms, GELU, soft-caps, per-layer-type RoPE (gemma_config.py)
    "gemma2": Family(False, False, True, 8192, head_dim=256, kv_heads=4),
    "gemma3_text": Family(False, True, True, 131072, head_dim=256, kv_heads=4),
    # Llama 4: NoPE / chunked layers, L2 q/k norms, MoE with a shared expert (llama4_config.py, llama4.py)
    "llama4_text": Family(False, False, True, 131072, head_dim=128, kv_heads=8, rms_norm_eps=1e-5),
}
PARTIAL_ROPE = {"glm4_moe": 0.5, "phi3": 1.0}  # the families that rotate part of a head: their default fraction
MLA_KINDS = ("deepseek_v3", "kimi_k2")
ACTIVATIONS = ("silu", "swish")  # transformers' ACT2FN: both SiLU, the MLP's activation in every family here


@dataclass(frozen=True)
class MLA:
    """DeepSeek multi-head latent attention sizes (the HF config's names)."""
    q_lora_rank: int | None     # None: a plain q_proj
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleave: bool = True  # rotary dims paired (x0, x1), (x2, x3), ... as DeepSeek's weights are laid out


def mla_from_hf(cfg: dict) -> MLA:
    """The MLA sizes of a DeepSeek-V3 / Kimi-K2 config.json."""
    return MLA(cfg.get("q_lora_rank"), cfg["kv_lora_rank"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"],
               cfg["v_head_dim"], bool(cfg.get("rope_interleave", True)))
