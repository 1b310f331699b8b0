"""Draft checkpoints for the server tests (the server itself starts through the root `serve` fixture)."""
import json
from pathlib import Path

import pytest


def save_random_draft(target_dir: Path, out: Path, name: str, seed: int = 1) -> Path:
    from toolkit.infer.config import ModelConfig
    from toolkit.infer.drafts import random_head, save_eagle3
    from toolkit.models import fingerprint

    cfg = json.loads((target_dir / "config.json").read_text())
    head = random_head(ModelConfig.from_folder(target_dir), list(range(0, cfg["vocab_size"], 5)), seed=seed)
    save_eagle3(head, out, cfg, name, fingerprint(target_dir))
    return out


@pytest.fixture(scope="session")
def tiny_draft(tiny_target, tmp_path_factory) -> Path:
    return save_random_draft(tiny_target, tmp_path_factory.mktemp("tiny-draft"), str(tiny_target))


@pytest.fixture(scope="session")
def random_draft():
    """`save_random_draft(target folder, out, recorded target name)`."""
    return save_random_draft
