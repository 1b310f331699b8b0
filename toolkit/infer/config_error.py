"""The one error a config.json this engine cannot run raises (config.py, rope.py)."""


class ConfigError(ValueError):
    """A config.json this engine cannot run; the message names the field and what is accepted."""
