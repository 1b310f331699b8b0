"""A training recipe: a YAML mapping of TrainConfig's keys, then `key=value` overrides (torchtune style), then
the command line's flags. Unknown keys and wrong types are errors that list what is accepted."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from toolkit.train.config import TrainConfig


def coerce(name: str, kind, text: str):
    """Parse an override's text as YAML, then check it against the field's annotated type."""
    base = str(kind)
    if isinstance(text, str) and not text.strip():  # `hidden_states=$UNSET`: none said by accident, not on purpose
        raise ValueError(f"{name}={text!r}: empty; give a value, or null for none" if "None" in base else
                         f"{name}={text!r}: empty; expected {base}")
    try:
        value = yaml.safe_load(text) if isinstance(text, str) else text
    except yaml.YAMLError as e:  # `lr=[1`, `extra={a: [1`
        if base.startswith("str"):
            return text.strip()
        raise ValueError(f"{name}={text!r}: not a YAML value ({getattr(e, 'problem', None) or e}); expected "
                         f"{base}") from None
    if value is None and "None" in base:
        return None
    if value is None:  # `data=`: an empty value would become the string 'None'
        raise ValueError(f"{name}={text!r}: empty; expected {base}")
    checks = [("list", list), ("dict", dict), ("float", (int, float)), ("int", int), ("bool", bool), ("str", str)]
    for word, typ in checks:
        if base.startswith(word) or base.startswith(f"{word} ") or base.startswith(f"{word}["):
            if word == "str":
                if isinstance(value, bool):  # YAML 1.1 reads a bare no / off / yes as a bool
                    return text.strip() if isinstance(text, str) else ("yes" if value else "no")
                if isinstance(value, (list, dict)):
                    raise ValueError(f"{name}={text!r}: expected {base}, got a {type(value).__name__}")
                return str(value)
            if word == "float" and isinstance(value, str):  # YAML 1.1 reads 3e-4 (no dot) as a string
                try:
                    value = float(value)
                except ValueError:
                    pass
            if word == "list" and "str" in base and isinstance(value, str):  # report_to=wandb: one name, or
                value = [v.strip() for v in value.split(",") if v.strip()]  # several comma-separated (HF's)
            if word == "list" and "int" in base and not all(
                    isinstance(v, int) and not isinstance(v, bool) for v in (value if isinstance(value, list) else [])):
                raise ValueError(f"{name}={text!r}: expected {base}, a list of integers such as [1, 14, 26]")
            if isinstance(value, typ) and not (word in ("int", "float") and isinstance(value, bool)):
                return float(value) if word == "float" else value
            raise ValueError(f"{name}={text!r}: expected {base}")
    return value


def load_config(path: str | None, overrides: list[str] = (), default_head: str | None = None,
                **flags) -> TrainConfig:
    """Recipe YAML (optional) <- key=value overrides <- flags that are not None; `head` defaults to the
    entry script's kind."""
    fields = {f.name: f.type for f in dataclasses.fields(TrainConfig)}
    values = {}
    if path:
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"--config {path}: " + ("a folder, not a recipe file (a YAML file, e.g. "
                                                            "recipes/smollm2-135m-eagle3.yaml)" if p.is_dir() else
                                                            "no such recipe file"))
        try:
            values = yaml.safe_load(p.read_text()) or {}
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            mark = getattr(e, "problem_mark", None)
            raise ValueError(f"--config {path}: not a YAML text ({getattr(e, 'problem', None) or e}"
                             + (f", line {mark.line + 1}" if mark else "") + "); a recipe is a YAML mapping of "
                             "key: value") from None
        if not isinstance(values, dict):
            raise ValueError(f"--config {path}: a recipe is a YAML mapping of key: value")
        if bad := [k for k in values if not isinstance(k, str)]:
            raise ValueError(f"--config {path}: keys {bad} are not names; a recipe is a YAML mapping of key: value "
                             "with the settings' names as keys")
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r}: write key=value")
        k, v = item.split("=", 1)
        values[k.strip()] = v
    values.update({k: v for k, v in flags.items() if v is not None})
    if default_head:
        values.setdefault("head", default_head)
    unknown = sorted(set(values) - set(fields))
    if unknown:
        import difflib

        from toolkit.train.specforge_keys import explain

        close = {k: difflib.get_close_matches(k.replace("-", "_"), fields, n=1) for k in unknown}
        meant = "; ".join(explain(k) or f"{k}: did you mean {close[k][0]}?" for k in unknown
                          if explain(k) or close[k])
        raise ValueError(f"unknown config keys {unknown}" + (f" ({meant})" if meant else "")
                         + f"; accepted: {', '.join(fields)}")
    typed = {k: coerce(k, fields[k], v) for k, v in values.items()}
    return TrainConfig(**typed)
