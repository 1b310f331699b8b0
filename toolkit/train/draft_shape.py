"""A recipe's `draft_config`: SpecForge's draft-model-config (`--draft-model-config configs/<model>-eagle3.json`)
read as the shape of the EAGLE-3 head to train: its decoder layers, MLP width, attention heads / KV heads / head
dim, draft vocabulary size and the target layers it fuses, as the file gives them; so a head trained here has the
tensors SpecForge would have trained from that file (its Qwen3-4B config, for one, gives the draft layer 80-wide
heads where the target's are 128). Its hidden size and vocabulary must be the target's: the head reads the
target's embedding and hidden states. The rest of the target's layer (RoPE, norms' eps) is kept, as SpecForge's
configs copy it."""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from toolkit.json_files import read_json

# the recipe key each file key fills, with the recipe's default (a recipe value off its default must agree)
RECIPE_KEYS = {"num_hidden_layers": ("num_layers", 1), "intermediate_size": ("draft_intermediate_size", None),
               "draft_vocab_size": ("draft_vocab_size", 32000)}


@dataclass(frozen=True)
class DraftShape:
    hidden_size: int
    num_layers: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    draft_vocab_size: int | None  # None: the file gives none (the recipe's draft_vocab_size stands)
    vocab_size: int | None
    aux_layers: list[int] | None  # target layer outputs (eagle_config's ids; the top-level ids less one)


def read(path: str | Path) -> DraftShape:
    """The shape a SpecForge draft config gives, or a ValueError naming the file and the key."""
    cfg = read_json(path, "draft_config")
    if not isinstance(cfg, dict):
        raise ValueError(f"draft_config {path}: a JSON object (a draft model's config.json) is expected, got "
                         f"{type(cfg).__name__}")

    def number(key: str, default=None, need: bool = True):
        value = cfg.get(key, default)
        if value is None and not need:
            return None
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"draft_config {path}: {key} must be a positive integer, got {value!r}")
        return value

    hidden, heads = number("hidden_size"), number("num_attention_heads")
    top = cfg.get("eagle_aux_hidden_state_layer_ids")
    aux = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or (
        [i - 1 for i in top] if top else None)  # SGLang's top-level ids name the layer whose input is taken
    if aux is not None and (len(aux) != 3 or not all(isinstance(i, int) and i >= 0 for i in aux)):
        raise ValueError(f"draft_config {path}: eagle_aux_hidden_state_layer_ids {aux}: give 3 target layer ids")
    return DraftShape(hidden, number("num_hidden_layers", 1), number("intermediate_size"), heads,
                      number("num_key_value_heads", heads), number("head_dim", hidden // heads),
                      number("draft_vocab_size", need=False), number("vocab_size", need=False), aux)


def merge(cfg) -> list[str]:
    """Fill the TrainConfig `cfg`'s num_layers, draft_intermediate_size, draft_vocab_size and aux_layers from its
    draft_config; returns the problems (a recipe value that disagrees with the file, a key the file cannot serve)."""
    if cfg.head != "eagle3":
        return [f"draft_config: SpecForge's draft configs shape an EAGLE-3 head, not an {cfg.head} head"]
    if cfg.init_from:
        return [f"draft_config and init_from both give the head's shape: init_from {cfg.init_from} has its own; "
                "drop one"]
    try:
        shape = read(cfg.draft_config)
    except (OSError, ValueError) as err:
        return [str(err) if isinstance(err, ValueError) else f"draft_config {cfg.draft_config}: {err.strerror}"]
    problems = []
    values = {"num_hidden_layers": shape.num_layers, "intermediate_size": shape.intermediate_size,
              "draft_vocab_size": shape.draft_vocab_size}
    for key, (field, default) in RECIPE_KEYS.items():
        value, given = values[key], getattr(cfg, field)
        if value is None:
            continue
        if given not in (default, value):
            problems.append(f"{field} {given} and draft_config's {key} {value} disagree: give one")
        setattr(cfg, field, value)
    if shape.aux_layers is not None:
        if cfg.aux_layers not in (None, shape.aux_layers):
            problems.append(f"aux_layers {cfg.aux_layers} and draft_config's eagle_aux_hidden_state_layer_ids "
                            f"{shape.aux_layers} disagree: give one")
        cfg.aux_layers = list(shape.aux_layers)
    return problems


def draft_layer(shape: DraftShape, layer, target, path) -> object:
    """`layer` (the head's ModelConfig built from the target's) with the file's attention shape; refuses a file
    whose hidden size or vocabulary is not the target's."""
    problems = []
    if shape.hidden_size != target.hidden_size:
        problems.append(f"hidden_size {shape.hidden_size} != the target's {target.hidden_size}")
    if shape.vocab_size is not None and shape.vocab_size != target.vocab_size:
        problems.append(f"vocab_size {shape.vocab_size} != the target's {target.vocab_size}")
    if problems:
        raise ValueError(f"draft_config {path} is not for this target ({target.model_type}): " + "; ".join(problems)
                         + "; give the draft config made for this target, or none (the target's own shape)")
    return replace(layer, num_heads=shape.num_heads, num_kv_heads=shape.num_kv_heads, head_dim=shape.head_dim)
