"""Reading the JSON files of a user's folders (a model's config.json, a prepared dataset's toolkit_prepare.json, a
dump's index.json, a run's train_config.json): an error names the file and where it broke, where json's own said
only "Expecting property name: line 1 column 2"."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_json(path: str | Path, what: str = "") -> Any:
    path, label = Path(path), f"{what} {path}" if what else str(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{label}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}); fix it or write "
                         "it again") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{label}: not UTF-8 text ({e.reason} at byte {e.start})") from None
