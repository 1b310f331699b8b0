"""What Gemma 2 / Gemma 3 (text) targets do beyond the Llama layer, read from an HF config.json as transformers'
Gemma2Config / Gemma3TextConfig read it (toolkit/infer/gemma.py builds the layer):

    embedding     times sqrt(hidden_size), the factor rounded to the weights' dtype
    norms         RMSNorm scaled by (1 + weight) in fp32, then rounded; four per layer: the attention's output
                  and the MLP's output are normed before their residual adds ("sandwich" norms)
    attention     scaled by query_pre_attn_scalar^-0.5 (not head_dim^-0.5); Gemma 2's scores soft-capped
                  (tanh(s / cap) * cap, attn_logit_softcapping; Gemma 3 ignores the key, as transformers does);
                  Gemma 3's q / k normed per head
    MLP           GELU (tanh approximation: `hidden_activation` gelu_pytorch_tanh) of the gate times up
    logits        soft-capped by final_logit_softcapping (Gemma 2: 30; not in Gemma 3's multimodal class)
    layers        sliding and full attention by `layer_types` (Gemma 2: every other one, Gemma 3: five of six
                  slide); Gemma 3's sliding layers rotate with their own RoPE base (rope_local_base_freq, or
                  rope_parameters["sliding_attention"]), its full ones with rope_parameters["full_attention"]

Gemma 3's multimodal checkpoints (model_type gemma3) hold this text model in `text_config`; their vision tower
is not loaded (hf_names.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from toolkit.infer.config_error import ConfigError

GEMMA_KINDS = ("gemma2", "gemma3_text")
GELUS = {"gelu_pytorch_tanh": "tanh", "gelu": "none"}  # transformers' ACT2FN names -> F.gelu's `approximate`
_PATTERN = {"gemma2": 2, "gemma3_text": 6}  # by default layer i slides unless (i + 1) % pattern == 0


@dataclass(frozen=True)
class Gemma:
    query_pre_attn_scalar: float        # attention scores times query_pre_attn_scalar ** -0.5
    attn_softcap: float | None = None   # Gemma 2's attn_logit_softcapping
    final_softcap: float | None = None  # final_logit_softcapping
    local_rope_theta: float | None = None  # Gemma 3: the sliding layers' RoPE base (default rope type); None: one
    local_layers: tuple[int, ...] = ()     # the layers local_rope_theta rotates (Gemma 3's sliding_attention)
    activation: str = "gelu_pytorch_tanh"

    def __post_init__(self):
        if self.query_pre_attn_scalar <= 0:
            raise ConfigError(f"query_pre_attn_scalar must be positive, got {self.query_pre_attn_scalar}")
        for name in ("attn_softcap", "final_softcap", "local_rope_theta"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"{name} must be positive or null, got {value}")
        if self.activation not in GELUS:
            raise ConfigError(f"hidden_activation {self.activation!r} is not supported; accepted: {sorted(GELUS)}")

    @property
    def scale(self) -> float:
        return self.query_pre_attn_scalar ** -0.5

    @property
    def gelu_approximate(self) -> str:
        return GELUS[self.activation]


def layer_types(kind: str, cfg: dict) -> list[str]:
    """Each layer's "sliding_attention" or "full_attention": `layer_types`, else the family's pattern
    (Gemma 3's `sliding_window_pattern`, default 6; Gemma 2's 2, whatever its config says, as transformers)."""
    n = cfg["num_hidden_layers"]
    if cfg.get("layer_types") is not None:
        types = list(cfg["layer_types"])
        if len(types) != n or set(types) - {"sliding_attention", "full_attention"}:
            raise ConfigError(f"layer_types must name sliding_attention or full_attention for each of the "
                              f"{n} layers, got {types}")
        return types
    pattern = int(kind == "gemma3_text" and cfg.get("sliding_window_pattern") or _PATTERN[kind])
    return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]


def gemma_rope(kind: str, cfg: dict) -> tuple[dict, float | None]:
    """(cfg with the full-attention layers' RoPE as the top-level rope parameters rope.resolve reads, the sliding
    layers' base or None). Gemma 3: transformers 5's per-layer-type `rope_parameters`, or 4.x's `rope_theta`
    (default 1e6) / `rope_scaling` (the full layers') / `rope_local_base_freq` (default 1e4)."""
    if kind != "gemma3_text":
        return cfg, None
    params = cfg.get("rope_parameters") or {}
    if params and not ("full_attention" in params or "sliding_attention" in params):  # transformers ignores it
        raise ConfigError(f"Gemma 3's rope_parameters {params} is not per layer type: give "
                          "{\"full_attention\": {...}, \"sliding_attention\": {...}} (transformers 5), or rope_scaling "
                          "for the full layers with rope_theta / rope_local_base_freq (4.x)")
    local = dict(params.get("sliding_attention") or {"rope_type": "default"})
    full = {}
    for src in (params.get("full_attention") or {}, cfg.get("rope_scaling") or {}):  # a 4.x rope_scaling: merged
        src = dict(src)
        rope_type = src.pop("rope_type", None) or src.pop("type", None)  # 4.x spelled it "type" (gemma-3-4b-it)
        src.pop("type", None)
        full.update(src, **({"rope_type": rope_type} if rope_type else {}))
    full.setdefault("rope_type", "default")
    # per layer type, yarn / llama3 / longrope take original_max_position_embeddings from the layer's own
    # parameters, else max_position_embeddings: a top-level one is not read (modeling_rope_utils)
    if full["rope_type"] in ("llama3", "yarn", "longrope"):
        full.setdefault("original_max_position_embeddings", cfg.get("max_position_embeddings", 131072))
    full.setdefault("rope_theta", cfg.get("rope_theta", 1_000_000.0))
    local.setdefault("rope_theta", cfg.get("rope_local_base_freq", 10_000.0))
    if local.get("rope_type", local.get("type", "default")) != "default":
        raise ConfigError(f"Gemma 3's sliding layers' rope type {local.get('rope_type')!r} is not supported; "
                          "accepted: default")
    rest = {k: v for k, v in cfg.items() if k not in ("rope_scaling", "rope_theta", "original_max_position_embeddings")}
    return {**rest, "rope_parameters": full}, float(local["rope_theta"])


def gemma_from_hf(kind: str, cfg: dict, local_theta: float | None, multimodal: bool = False) -> Gemma:
    """The Gemma fields of a text config (cfg after gemma_rope). As transformers runs them: Gemma 3 never caps its
    attention scores (Gemma3Attention keeps attn_logit_softcapping and never applies it), and its multimodal
    class (`multimodal`: Gemma3ForConditionalGeneration) never caps its logits."""
    if cfg.get("use_bidirectional_attention"):
        raise ConfigError("use_bidirectional_attention true (an embedding model) is not supported: the engine "
                          "decodes causal language models")
    types = layer_types(kind, cfg)
    final = None if multimodal else cfg.get("final_logit_softcapping", 30.0 if kind == "gemma2" else None)
    attn = cfg.get("attn_logit_softcapping", 50.0) if kind == "gemma2" else None
    return Gemma(query_pre_attn_scalar=float(cfg.get("query_pre_attn_scalar", 256)),
                 attn_softcap=None if attn is None else float(attn),
                 final_softcap=None if final is None else float(final),
                 local_rope_theta=local_theta,
                 local_layers=tuple(i for i, t in enumerate(types) if t == "sliding_attention") if local_theta else (),
                 activation=cfg.get("hidden_activation") or "gelu_pytorch_tanh")


def gemma_sliding_window(kind: str, cfg: dict) -> dict:
    """family_keys.sliding_window's answer for Gemma: `sliding_window` (default 4096; null: none) on the layers
    layer_types names sliding_attention."""
    window = cfg.get("sliding_window", 4096)
    types = layer_types(kind, cfg)
    if "sliding_attention" not in types:
        return {}
    if not window:  # transformers fails at its first forward
        raise ConfigError("sliding_window is null but some layers are sliding_attention (layer_types, or the "
                          "family's pattern): give the window, or layer_types with full_attention for every layer")
    full = tuple(i for i, t in enumerate(types) if t != "sliding_attention")
    return {"sliding_window": int(window), "full_layers": full}
