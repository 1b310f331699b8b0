"""Mixture-of-experts sizes and routing, read from an HF config.json for the six MoE families the engine runs
(toolkit/infer/moe.py builds the MLPs, gpt_oss.py GPT-OSS's):

    deepseek_v3  sigmoid scores, group-limited top-k with a correction bias, scaled; ungated shared experts;
    glm4_moe     dense MLPs below first_k_dense_replace (GLM-4.5 routes as DeepSeek-V3)
    mixtral      softmax over num_local_experts, top-k, always renormalised (checkpoints: block_sparse_moe.*)
    qwen2_moe    softmax top-k, renormalised only with norm_topk_prob; one shared expert of its own size behind a
                 sigmoid gate (shared_expert_gate)
    qwen3_moe    softmax top-k as Qwen2-MoE, no shared expert
    gpt_oss      top-k of a biased router's logits, softmax over those k; experts with biases and a clamped SwiGLU
                 (swiglu_limit, swiglu_alpha), stored as one [E, H, 2I] gate/up and one [E, I, H] down tensor
    llama4_text  top-k router logits, sigmoid: each chosen expert's INPUT scaled by it; a shared expert of the
                 experts' size; experts stored as one [E, H, 2I] gate/up (halves) and one [E, I, H] down tensor;
                 sparse on moe_layers (llama4.py)

Qwen's layers are sparse unless listed in mlp_only_layers or off the decoder_sparse_step (transformers: layer l
is sparse when l not in mlp_only_layers and (l + 1) % decoder_sparse_step == 0); the others keep a dense MLP of
intermediate_size.
"""
from __future__ import annotations

from dataclasses import dataclass

from toolkit.infer.config_error import ConfigError

SCORING = ("sigmoid", "softmax", "topk_softmax", "llama4")


@dataclass(frozen=True)
class MoE:
    num_experts: int
    top_k: int
    intermediate_size: int           # per expert
    scoring: str = "sigmoid"         # "sigmoid": DeepSeek-V3's group-limited routing; "softmax": Mixtral / Qwen;
                                     # "topk_softmax": GPT-OSS (softmax over the top-k logits of a biased router);
                                     # "llama4": sigmoid of the top-k logits, scaling the experts' input
    n_group: int = 1
    topk_group: int = 1
    shared_size: int = 0             # the shared expert's intermediate size (0: none)
    shared_gate: bool = False        # Qwen2-MoE: the shared expert's output times sigmoid(shared_expert_gate(x))
    dense_layers: tuple[int, ...] = ()  # layers that keep a dense MLP of the model's intermediate_size
    routed_scaling_factor: float = 1.0
    norm_topk_prob: bool = True
    weights_in_model_dtype: bool = False  # Qwen: the routing weights rounded to the model's dtype before use
    swiglu_limit: float = 7.0        # GPT-OSS's experts: gate clamped above, up on both sides, to this
    swiglu_alpha: float = 1.702      # GPT-OSS's experts: gate * sigmoid(alpha * gate)

    def __post_init__(self):
        if self.scoring not in SCORING:
            raise ConfigError(f"MoE scoring {self.scoring!r}: accepted {SCORING}")
        if self.num_experts <= 0 or self.intermediate_size <= 0:
            raise ConfigError(f"MoE: the experts ({self.num_experts}) and their intermediate size "
                              f"({self.intermediate_size}) must be positive")
        if self.num_experts % self.n_group or not 1 <= self.topk_group <= self.n_group:
            raise ConfigError(f"MoE: n_routed_experts {self.num_experts} must split into n_group {self.n_group} "
                              f"groups and topk_group {self.topk_group} must be in 1..n_group")
        if self.swiglu_limit <= 0:
            raise ConfigError(f"MoE: swiglu_limit must be positive, got {self.swiglu_limit}")
        if not 1 <= self.top_k <= self.num_experts // self.n_group * self.topk_group:
            raise ConfigError(f"MoE: num_experts_per_tok {self.top_k} must be in 1..{self.num_experts} (the "
                              "experts of topk_group groups)")

    def sparse(self, layer: int) -> bool:
        """Whether decoder layer `layer` (an MTP layer after the last included) has the MoE MLP."""
        return layer not in self.dense_layers


def moe_from_hf(kind: str, cfg: dict) -> MoE | None:
    """The MoE of a config.json of model_type `kind` (None for the dense families)."""
    layers = cfg["num_hidden_layers"]
    if kind in ("deepseek_v3", "kimi_k2", "glm4_moe"):  # GLM-4.5 routes as DeepSeek-V3 (its config names no
        # scoring_func); Kimi-K2 is DeepSeek-V3's architecture
        if cfg.get("scoring_func", "sigmoid") != "sigmoid" or cfg.get("topk_method", "noaux_tc") != "noaux_tc":
            raise ConfigError("DeepSeek MoE routing: accepted scoring_func sigmoid with topk_method noaux_tc "
                              "(DeepSeek-V3); got " + f"{cfg.get('scoring_func')}/{cfg.get('topk_method')}")
        size = cfg["moe_intermediate_size"]
        return MoE(cfg["n_routed_experts"], cfg["num_experts_per_tok"], size, "sigmoid", cfg.get("n_group") or 1,
                   cfg.get("topk_group") or 1, shared_size=size * (cfg.get("n_shared_experts") or 0),
                   dense_layers=tuple(range(cfg.get("first_k_dense_replace", 0))),
                   routed_scaling_factor=float(cfg.get("routed_scaling_factor", 1.0)),
                   norm_topk_prob=bool(cfg.get("norm_topk_prob", True)))
    if kind == "mixtral":
        return MoE(_experts(cfg, 8), cfg.get("num_experts_per_tok", 2), cfg["intermediate_size"],
                   "softmax")
    if kind in ("qwen2_moe", "qwen3_moe"):
        step, only = cfg.get("decoder_sparse_step", 1), set(cfg.get("mlp_only_layers") or ())
        if not isinstance(step, int) or step < 1:
            raise ConfigError(f"decoder_sparse_step must be a positive integer, got {step!r}")
        qwen2 = kind == "qwen2_moe"
        experts = _experts(cfg, 60 if qwen2 else 128)
        if experts <= 0:  # transformers then builds every layer dense
            return None
        return MoE(experts, cfg.get("num_experts_per_tok", 4 if qwen2 else 8),
                   cfg.get("moe_intermediate_size", 1408 if qwen2 else 768), "softmax",
                   shared_size=cfg.get("shared_expert_intermediate_size", 5632) if qwen2 else 0, shared_gate=qwen2,
                   dense_layers=tuple(i for i in range(layers) if i in only or (i + 1) % step),
                   norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
                   weights_in_model_dtype=True)
    if kind == "llama4_text":
        from toolkit.infer.llama4_config import moe_layers

        sparse = set(moe_layers(cfg))
        size = cfg.get("intermediate_size", 8192)
        return MoE(_experts(cfg, 16), cfg.get("num_experts_per_tok", 1), size, "llama4", shared_size=size,
                   dense_layers=tuple(i for i in range(layers) if i not in sparse)) if sparse else None
    if kind == "gpt_oss":
        return MoE(_experts(cfg, 128), cfg.get("num_experts_per_tok", 4), cfg.get("intermediate_size", 2880),
                   "topk_softmax", weights_in_model_dtype=True, swiglu_limit=float(cfg.get("swiglu_limit", 7.0)),
                   swiglu_alpha=float(cfg.get("swiglu_alpha", 1.702)))
    return None


def _experts(cfg: dict, default: int) -> int:
    """num_experts, or num_local_experts (transformers 5 writes Mixtral's and Qwen3-MoE's under this name)."""
    for key in ("num_experts", "num_local_experts"):
        if cfg.get(key) is not None:
            return int(cfg[key])
    return default
