"""An EAGLE-3 draft folder's config.json, read in each layout released heads ship in, as the server each was
made for reads it (docs/formats.md section 7):

- ours, SGLang's `LlamaForCausalLMEagle3`, SafeAILab's: a flat Llama config; `eagle_config`'s
  `eagle_aux_hidden_state_layer_ids` name layer outputs (our numbering).
- vLLM's `Eagle3LlamaForCausalLM` (and NVIDIA ModelOpt's exports): the top-level `eagle_aux_hidden_state_layer_ids`
  name the layer whose input vLLM captures (ours + 1); `norm_before_residual` (absent: false) and `norm_before_fc`
  (top level or in `eagle_config`).
- speculators (`speculators_model_type: "eagle3"`, Red Hat's released heads): the layer's config nested in
  `transformer_layer_config`, saved as a diff against transformers' class defaults (absent keys take them), and
  `norm_before_residual` absent = true, as vLLM's speculators reader (`update_eagle3`) takes it.

norm_before_residual: the first layer's residual is hidden_norm(h) rather than h. norm_before_fc: an RMSNorm over
the concatenated aux states (`input_norm.weight`, [3 Ht]) before fc. Both change the forward, so a head that has
them and is served without them drafts wrong tokens (losslessly, with a low τ): they are read, never ignored, and
a flag this engine does not implement is refused by name.
"""
from __future__ import annotations

from dataclasses import dataclass

EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "Eagle3Speculator", "Eagle3DraftModel")
VARIANTS = ("norm_before_residual", "norm_before_fc")  # the forward variants served (Eagle3Head's attributes)
UNSERVED_FLAGS = {"fc_norm": "an RMSNorm on each aux hidden state before fc (EAGLE 3.1)",
                  "norm_output": "a norm on the layer's output"}


@dataclass
class Eagle3Layout:
    config: dict                  # a flat Llama config of the draft's layers (for ModelConfig.from_hf)
    target_hidden: int            # Ht: fc takes 3 * Ht features
    aux_layers: list[int] | None  # our numbering (layer outputs); None: the target's default
    norm_before_residual: bool
    norm_before_fc: bool


def is_eagle3(cfg: dict) -> bool:
    return cfg.get("speculators_model_type") == "eagle3" or any(
        a in EAGLE3_ARCHITECTURES for a in cfg.get("architectures") or [])


def refuse_other_speculators(cfg: dict, folder) -> None:
    """A speculators folder of another model type than eagle3 is refused, with what is served."""
    kind = cfg.get("speculators_model_type")
    if kind is not None and kind != "eagle3":
        raise ValueError(f"draft {folder}: a speculators {kind!r} folder; of the speculators formats this engine "
                         "serves 'eagle3' (EAGLE-1/2 and MTP heads in the SGLang / vLLM layouts load as such)")


def read_eagle3_config(cfg: dict, folder) -> Eagle3Layout:
    """cfg: the folder's config.json. Raises ValueError naming what does not fit and what is accepted."""
    refuse_other_speculators(cfg, folder)
    kind = cfg.get("speculators_model_type")
    for flag, what in UNSERVED_FLAGS.items():
        if cfg.get(flag) or (cfg.get("eagle_config") or {}).get(flag):
            raise ValueError(f"draft {folder}: {flag}: true ({what}) is not served by this engine; it serves "
                             "EAGLE-3 heads with norm_before_residual and norm_before_fc either way")
    layer = cfg
    if kind == "eagle3":  # vLLM builds a speculators layer of its model_type (qwen3: Eagle3Qwen3)
        layer = _speculators_layer(cfg.get("transformer_layer_config"), folder)
        if layer.get("model_type", "llama") != "llama":
            raise ValueError(f"draft {folder}: its transformer_layer_config is model_type {layer['model_type']!r}; "
                             "this engine serves speculators EAGLE-3 heads of Llama layers (model_type 'llama')")
    # else SGLang and vLLM build Llama layers from the architecture (LlamaForCausalLMEagle3), whatever model_type
    # the config names: SpecForge's configs name their target's (phi4-mini: phi3, kimi-k2: kimi_k2); read as Llama
    layer = {**layer, "model_type": "llama",
             "draft_vocab_size": cfg.get("draft_vocab_size") or layer.get("draft_vocab_size")}
    eagle = cfg.get("eagle_config") or {}
    for ids in (cfg.get("eagle_aux_hidden_state_layer_ids"), eagle.get("eagle_aux_hidden_state_layer_ids")):
        if ids is not None and not (isinstance(ids, list) and all(type(i) is int for i in ids)):
            raise ValueError(f"draft {folder}: eagle_aux_hidden_state_layer_ids {ids!r}: give a list of layer ids "
                             "(integers)")
    top = cfg.get("eagle_aux_hidden_state_layer_ids") or []
    aux = eagle.get("eagle_aux_hidden_state_layer_ids") or [i - 1 for i in top] or None
    return Eagle3Layout(
        config=layer, target_hidden=cfg.get("target_hidden_size") or layer["hidden_size"], aux_layers=aux,
        norm_before_residual=bool(cfg.get("norm_before_residual", kind == "eagle3")),
        norm_before_fc=bool(cfg.get("norm_before_fc") or eagle.get("norm_before_fc")))


def _speculators_layer(layer, folder) -> dict:
    """transformer_layer_config with transformers' defaults for the keys its diff-dict left out."""
    if not isinstance(layer, dict):
        raise ValueError(f"draft {folder}: a speculators eagle3 config.json needs a transformer_layer_config "
                         "object (the draft layer's Llama config)")
    if layer.get("model_type", "llama") != "llama":
        return layer
    from transformers import LlamaConfig

    try:
        return LlamaConfig(**layer).to_dict()
    except (TypeError, ValueError, KeyError) as e:
        raise ValueError(f"draft {folder}: transformer_layer_config is not a valid Llama config: {e}") from None
