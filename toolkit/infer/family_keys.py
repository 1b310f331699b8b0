"""What some families' config.json keys mean beyond the Llama ones, read as their transformers config classes read
them (config.py builds the ModelConfig): which layers slide and over what window, Phi-3's old rope type names,
GPT-OSS's rope defaults."""
from __future__ import annotations

from toolkit.infer.gemma_config import GEMMA_KINDS, gemma_sliding_window


# The config classes' defaults for keys the Llama families always write but these may leave out: save_pretrained
# writes only non-default values, and Gemma 3's multimodal checkpoints hold a text_config of a few keys (gemma-3-4b-it:
# no vocab_size, heads or rope_theta); a default of the engine's own (rope theta 1e4, one routing group, no scaling)
# where the class has another loaded such a config without a word and computed other logits
SIZES = {
    "mixtral": dict(rope_theta=1e6),  # MixtralConfig.default_theta
    "deepseek_v3": dict(n_group=8, topk_group=4, routed_scaling_factor=2.5, n_shared_experts=1,
                        first_k_dense_replace=3),
    "glm4_moe": dict(n_shared_experts=1, first_k_dense_replace=1),
    # Phi3Config's class attribute: it overrides any original_max_position_embeddings inside rope_scaling
    "phi3": dict(original_max_position_embeddings=4096),
    "gemma2": dict(vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                   num_attention_heads=8),
    "gemma3_text": dict(vocab_size=262208, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                        num_attention_heads=8),
    "llama4_text": dict(vocab_size=202048, hidden_size=5120, intermediate_size=8192, num_hidden_layers=48,
                        num_attention_heads=40, rope_theta=500000.0),
}


def text_config(cfg: dict) -> dict:
    """A config.json's text config (its text_config, if any) with the sizes its config class fills in where it
    leaves them out (SIZES): the values transformers, SGLang and vLLM read."""
    t = cfg.get("text_config", cfg)
    return {**SIZES.get(t.get("model_type"), {}), **t}


def sliding_window(kind: str, cfg: dict) -> dict:
    """The window transformers applies ({"sliding_window": W, "full_layers": layers that do not slide}, or {}):
    Mistral's `sliding_window` (default 4096, null = off), Mixtral's and Phi-3's (default null), on every layer;
    the Qwen families' only with `use_sliding_window`: Qwen3-MoE's on every layer, Qwen2/3's and Qwen2-MoE's on
    the layers `layer_types` names sliding_attention, else on layers >= max_window_layers (Qwen2/3) or the even
    layers below max_window_layers (Qwen2-MoE); GPT-OSS's (default 128) on the layers `layer_types` names, by
    default the even ones; Gemma's (gemma_config.py) on the layers layer_types names."""
    layers = cfg["num_hidden_layers"]
    if kind in GEMMA_KINDS:
        return gemma_sliding_window(kind, cfg)
    if kind in ("qwen2", "qwen3", "mimo", "qwen2_moe", "qwen3_moe"):
        if not cfg.get("use_sliding_window"):
            return {}
    elif kind not in ("mistral", "mixtral", "phi3", "gpt_oss"):
        return {}
    window = cfg.get("sliding_window", {"mixtral": None, "phi3": None, "gpt_oss": 128}.get(kind, 4096))
    if not window:
        return {}
    if kind in ("mixtral", "qwen3_moe", "phi3"):
        slides = [True] * layers
    elif cfg.get("layer_types") is not None:
        slides = [t == "sliding_attention" for t in cfg["layer_types"]]
    elif kind == "mistral":
        slides = [True] * layers
    elif kind == "gpt_oss":
        slides = [i % 2 == 0 for i in range(layers)]
    elif kind == "qwen2_moe":
        slides = [i % 2 == 0 and i < cfg.get("max_window_layers", 28) for i in range(layers)]
    else:
        slides = [i >= cfg.get("max_window_layers", 28) for i in range(layers)]
    if not any(slides):
        return {}
    return {"sliding_window": int(window), "full_layers": tuple(i for i, s in enumerate(slides) if not s)}


def phi3_rope(cfg: dict) -> dict:
    """Phi3Config reads an old config's rope type "su" or "yarn" as longrope (Phi-3-mini-128k and kin)."""
    for key in ("rope_scaling", "rope_parameters"):
        r = cfg.get(key) or {}
        if r.get("rope_type", r.get("type")) in ("su", "yarn"):
            cfg = {**cfg, key: {**{k: v for k, v in r.items() if k != "type"}, "rope_type": "longrope"}}
    return cfg


def gpt_oss_rope(cfg: dict) -> dict:
    """GptOssConfig's defaults: theta 150000, and yarn (factor 32 over 4096 positions, beta 32 / 1, untruncated)
    when the config names no rope parameters."""
    theta = (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta", 150000.0))
    if cfg.get("rope_scaling") or cfg.get("rope_parameters"):
        return {**cfg, "rope_theta": theta}
    return {**cfg, "rope_theta": theta, "rope_parameters": {
        "rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
        "original_max_position_embeddings": 4096}}
