"""The one error a config.json this engine cannot run raises (config.py, rope.py), and the shape keys every
config.json must hold, checked before the build reads them."""


class ConfigError(ValueError):
    """A config.json this engine cannot run; the message names the field and what is accepted."""


SIZE_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")  # every family's
SIZE_OPTIONAL = ("intermediate_size", "num_key_value_heads", "head_dim", "max_position_embeddings")


def check_sizes(kind: str, cfg: dict) -> None:
    """The shape keys a config.json must hold as positive integers: named when absent or of another type, not a
    KeyError or TypeError from deep in the build."""
    needed = SIZE_KEYS if kind == "llama4_text" else (*SIZE_KEYS, "intermediate_size")  # Llama 4: its _mlp
    missing = [k for k in needed if k not in cfg]
    if missing:
        raise ConfigError(f"no {', '.join(missing)} (a {kind} model's shape; accepted: positive integers)")
    for key in (*SIZE_KEYS, *SIZE_OPTIONAL):
        value = cfg.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ConfigError(f"{key} {value!r}: expected a positive integer")
