"""A small prepared dataset for the tiny target (24 short conversations)."""
from __future__ import annotations

import json

import pytest

from toolkit.cli import main


@pytest.fixture(scope="session")
def prepared(tiny_target, tmp_path_factory):
    folder = tmp_path_factory.mktemp("prep")
    topics = ["apples", "rivers", "prime numbers", "the moon", "bread", "chess", "rain", "python lists"]
    convs = [{"messages": [{"role": "user", "content": f"Tell me about {t}, part {i}."},
                           {"role": "assistant", "content": f"Here is a short note about {t}. " * 3}]}
             for i in range(3) for t in topics]
    (folder / "c.jsonl").write_text("".join(json.dumps(c) + "\n" for c in convs))
    assert main(["prepare-data", "--model", str(tiny_target), "--data", str(folder / "c.jsonl"),
                 "--out", str(folder / "ds"), "--max-len", "96"]) == 0
    return folder / "ds"
