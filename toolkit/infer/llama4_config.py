"""What Llama 4 (text: Scout, Maverick) does beyond the Llama layer, read from an HF config.json as transformers'
Llama4TextConfig reads it (toolkit/infer/llama4.py builds the layer):

    RoPE layers   `no_rope_layers[l] == 1` (default: all but every `no_rope_layer_interval`-th, 4): RoPE over
                  interleaved pairs (x0, x1), (x2, x3), ... (the q / k projections' rows are de-interleaved on load,
                  hf_names.py, so the engine's half-split RoPE gives the same scores), then q and k L2-normed
                  (`use_qk_norm`: RMS without a weight), attending within chunks of `attention_chunk_size` positions
    NoPE layers   no RoPE, attend over the whole context; with `attn_temperature_tuning` the query at position p is
                  scaled by log1p(floor((p + 1) / floor_scale)) * attn_scale + 1
    MLPs          MoE on `moe_layers` (default every `interleave_moe_layer_step`-th): top-k router logits, sigmoid,
                  the expert's INPUT scaled by it, plus a shared expert (moe_config.py); dense layers of
                  `intermediate_size_mlp`

Llama 4's multimodal checkpoints (model_type llama4) hold this text model in `text_config`.
"""
from __future__ import annotations

from dataclasses import dataclass

from toolkit.infer.config_error import ConfigError


@dataclass(frozen=True)
class Llama4:
    nope_layers: tuple[int, ...] = ()     # layers without RoPE (temperature-tuned queries)
    chunk: int | None = 8192              # attention_chunk_size
    chunked_layers: tuple[int, ...] = ()  # the layers attending within chunks (layer_types' chunked_attention)
    qk_l2_norm: bool = True               # use_qk_norm, on the RoPE layers
    floor_scale: float | None = 8192.0    # attn_temperature_tuning's floor_scale; None: no tuning
    attn_scale: float = 0.1

    def __post_init__(self):
        if self.chunk is not None and self.chunk <= 0:
            raise ConfigError(f"attention_chunk_size must be positive or null, got {self.chunk}")
        if self.floor_scale is not None and self.floor_scale <= 0:
            raise ConfigError(f"floor_scale must be positive, got {self.floor_scale}")

    def chunked(self, layer: int) -> bool:
        """Whether layer `layer` attends only within its query's chunk of positions."""
        return self.chunk is not None and layer in self.chunked_layers


def llama4_from_hf(cfg: dict) -> Llama4:
    n = cfg["num_hidden_layers"]
    interval = int(cfg.get("no_rope_layer_interval", 4))
    rope = cfg.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(n)]
    if len(rope) != n:
        raise ConfigError(f"no_rope_layers names {len(rope)} layers; the model has {n}")
    chunk = cfg.get("attention_chunk_size", 8192)
    types = cfg.get("layer_types") or ["chunked_attention" if r and chunk is not None else "full_attention"
                                       for r in rope]
    if len(types) != n or set(types) - {"chunked_attention", "full_attention"}:
        raise ConfigError(f"layer_types must name chunked_attention or full_attention for each of the {n} layers, "
                          f"got {types}")
    if chunk is None and "chunked_attention" in types:  # transformers fails at its first forward
        raise ConfigError("attention_chunk_size is null but layer_types names chunked_attention layers: give the "
                          "chunk size, or full_attention for every layer")
    tuning = cfg.get("attn_temperature_tuning", True)
    return Llama4(nope_layers=tuple(i for i, r in enumerate(rope) if not r),
                  chunk=None if chunk is None else int(chunk),
                  chunked_layers=tuple(i for i, t in enumerate(types) if t == "chunked_attention"),
                  qk_l2_norm=bool(cfg.get("use_qk_norm", True)),
                  floor_scale=float(cfg.get("floor_scale", 8192)) if tuning else None,
                  attn_scale=float(cfg.get("attn_scale", 0.1)))


def moe_layers(cfg: dict) -> list[int]:
    """The layers with a MoE MLP: `moe_layers`, else every interleave_moe_layer_step-th (default each)."""
    if cfg.get("moe_layers") is not None:
        return list(cfg["moe_layers"])
    step = int(cfg.get("interleave_moe_layer_step", 1))
    return list(range(step - 1, cfg["num_hidden_layers"], step))
