"""What a request that leaves out temperature / top_p / top_k / min_p / repetition_penalty / max_tokens gets.

`--generation-config auto` (the default, as vLLM's): the values the target's generation_config.json recommends
(Qwen3: temperature 0.6, top_p 0.95, top_k 20; Qwen2.5-Instruct: 0.7 / 0.8 / 20 and repetition_penalty 1.05;
Llama-3.1-Instruct: 0.6 / 0.9), so a client that sends only messages gets what the same request gets from vLLM;
`max_new_tokens` there caps a chat reply that names no max_tokens. `vllm`: the neutral values (temperature 1,
top_p 1, no top-k, no min-p, no repetition penalty, the rest of the context). A folder: its
generation_config.json. A request's own values always win.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

CHOICES = "auto, vllm or a folder holding a generation_config.json"


@dataclass(frozen=True)
class SamplingDefaults:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0                 # 0 = off
    max_tokens: int | None = None  # None: the rest of the context
    min_p: float = 0.0             # 0 = off
    repetition_penalty: float = 1.0  # 1 = off
    source: str = "neutral"

    def __post_init__(self):
        def bad(key: str, accepted: str) -> ValueError:
            return ValueError(f"{self.source}: {key} {getattr(self, key)!r} is not a sampling value this server "
                              f"takes ({accepted}); fix the file or pass --generation-config vllm")

        if not (isinstance(self.temperature, (int, float)) and 0 <= self.temperature < math.inf):
            raise bad("temperature", "a finite number >= 0")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise bad("top_p", "in (0, 1]")
        if not (isinstance(self.top_k, int) and self.top_k >= 0):
            raise bad("top_k", "an integer >= 0, or -1 for none")
        if self.max_tokens is not None and not (isinstance(self.max_tokens, int) and self.max_tokens >= 1):
            raise bad("max_tokens", "an integer >= 1 (max_new_tokens)")
        if not (isinstance(self.min_p, (int, float)) and 0 <= self.min_p <= 1):
            raise bad("min_p", "in [0, 1]")
        if not (isinstance(self.repetition_penalty, (int, float)) and 0 < self.repetition_penalty < math.inf):
            raise bad("repetition_penalty", "a finite number > 0")

    def describe(self) -> str:
        what = f"temperature {self.temperature}, top_p {self.top_p}, top_k {self.top_k or 'off'}"
        what += f", min_p {self.min_p}" if self.min_p else ""
        what += f", repetition_penalty {self.repetition_penalty}" if self.repetition_penalty != 1 else ""
        what += f", max_tokens {self.max_tokens}" if self.max_tokens else ""
        return f"{what} ({self.source})"


def sampling_defaults(choice: str, folder: Path | None) -> SamplingDefaults:
    """The defaults `--generation-config choice` gives for the target in `folder` (None: no folder known)."""
    if choice == "vllm":
        return SamplingDefaults(source="--generation-config vllm")
    if choice == "auto":
        path = Path(folder) / "generation_config.json" if folder is not None else None
        if path is None or not path.is_file():
            return SamplingDefaults(source="the target has no generation_config.json")
    else:
        path = Path(choice) / "generation_config.json"
        if not path.is_file():
            raise ValueError(f"--generation-config {choice}: no generation_config.json there; give {CHOICES}")
    try:
        cfg = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not readable JSON ({e}); fix it or pass --generation-config vllm") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: not a JSON object; fix it or pass --generation-config vllm")
    top_k = cfg.get("top_k")
    if top_k == -1:  # vLLM's "none"
        top_k = 0
    values = {"temperature": cfg.get("temperature"), "top_p": cfg.get("top_p"), "top_k": top_k,
              "max_tokens": cfg.get("max_new_tokens"), "min_p": cfg.get("min_p"),
              "repetition_penalty": cfg.get("repetition_penalty")}
    return SamplingDefaults(**{k: v for k, v in values.items() if v is not None}, source=str(path))
