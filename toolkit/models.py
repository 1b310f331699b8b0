"""Resolve a target model to a local Hugging Face folder, fingerprint it, and list what is cached.

A target is named one of three ways:
  * a local HF folder (with config.json),
  * a built-in alias (`smollm2-135m-instruct`, the default wherever --model is optional),
  * a hub id `org/name`, downloaded only when online; with HF_HUB_OFFLINE=1 or no network it must already
    be in the HF cache, else we fail fast naming the id and HF_HUB_OFFLINE.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import struct
from pathlib import Path

from toolkit import hub
from toolkit.embedded import DEFAULT_MODEL, EMBEDDED, MARKER, cache_dir, ensure_embedded, model_dir


class TargetError(ValueError):
    """A --model value that cannot be resolved; the message says what is accepted."""


def resolve_target(name: str | None = None) -> Path:
    """Return the local HF folder of a target given as a folder, an alias or a hub id."""
    name = name or DEFAULT_MODEL
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise TargetError(f"--model {name}: the folder has no config.json (expected a Hugging Face model folder)")
        _refuse_a_draft(name, path / "config.json")
        return path
    if name in EMBEDDED:
        return ensure_embedded(name)
    if path.exists():
        raise TargetError(f"--model {name}: is a file; give a Hugging Face model folder, a hub id or one of "
                          f"the built-in aliases {sorted(EMBEDDED)}")
    if hub.HUB_ID.match(name):
        return _from_hub(name)
    raise TargetError(f"--model {name!r} is not a folder, not a hub id (org/name) and not a built-in alias; "
                      f"built-in aliases: {', '.join(sorted(EMBEDDED))}")


def _refuse_a_draft(name: str, config: Path) -> None:
    """A draft folder given as the target failed later as a weight-name mismatch that named neither."""
    from toolkit.infer.eagle3_config import is_eagle3

    try:
        cfg = json.loads(config.read_text())
    except (ValueError, OSError):
        return  # the loader names a broken config.json
    if not isinstance(cfg, dict):  # every reader of it would fail on .get / .items with a traceback
        raise TargetError(f"--model {name}: config.json holds {type(cfg).__name__}, not a JSON object of the model's "
                          "settings")
    mark = cfg.get("toolkit")
    if is_eagle3(cfg) or (isinstance(mark, dict) and mark.get("head")):
        archs = ", ".join(cfg.get("architectures") or []) or (mark or {}).get("head")
        raise TargetError(f"--model {name}: this is a draft folder ({archs}), not a target model; give the target "
                          f"it drafts for as --model, and the draft as --draft (bench, serve) or init_from= (train)")


def _from_hub(repo_id: str) -> Path:
    try:
        return hub.snapshot(repo_id, "--model", hub.MODEL_FILES,
                            f"a local folder or a built-in alias ({', '.join(sorted(EMBEDDED))})")
    except ValueError as err:
        raise TargetError(str(err)) from None


# config.json keys that say who wrote the file, not what the model is: transformers stamps its version, so
# the same model saved by 5.23 and by 5.24 must keep one id
WRITER_KEYS = ("transformers_version", "_name_or_path", "_commit_hash")


def fingerprint(folder: Path) -> str:
    """A short stable id of a model folder: sha256 over config.json's content (its keys sorted, the writer's
    stamps WRITER_KEYS left out) and, per weight file, its name, size, safetensors header (names, dtypes, shapes,
    offsets) and first/last MiB of data. Cheap on 16 GB models, yet changes when the architecture, shapes or the
    weights' ends change. The weight files are those the model is loaded from (infer/weight_files.py:
    model.safetensors or the index's shards), so a file beside them that no loader reads (Mistral's
    consolidated.safetensors, a leftover) leaves the id as it is."""
    cfg = json.loads((Path(folder) / "config.json").read_text())
    canonical = json.dumps({k: v for k, v in cfg.items() if k not in WRITER_KEYS}, sort_keys=True)
    return _fingerprint(Path(folder), canonical.encode())


def same_target(recorded: str, folder: Path) -> bool:
    """Whether a recorded fingerprint names this folder's model: today's id, or the one written before 2026-11-28
    (config.json's raw bytes, which changed with the transformers version that saved them)."""
    folder = Path(folder)
    return recorded in (fingerprint(folder), _fingerprint(folder, (folder / "config.json").read_bytes()))


def _fingerprint(folder: Path, config: bytes) -> str:
    from toolkit.infer.weight_files import weight_files

    h = hashlib.sha256(config)
    try:
        files = weight_files(folder)
    except ValueError:  # no weights here (yet): the config alone
        files = []
    for f in files:
        size = f.stat().st_size
        h.update(f"{f.name}:{size}".encode())
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            h.update(fh.read(n))
            h.update(fh.read(1 << 20))
            fh.seek(max(8 + n, size - (1 << 20)))
            h.update(fh.read())
    return h.hexdigest()[:16]


def describe_models() -> list[dict]:
    rows = []
    for alias, spec in sorted(EMBEDDED.items()):
        folder = model_dir(alias)
        ready = (folder / MARKER).is_file()
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if ready else 0
        wheel = (cache_dir() / "wheels" / spec.wheel_name).is_file()
        rows.append({"alias": alias, "original": spec.hub_id, "source": spec.requirement,
                     "default": alias == DEFAULT_MODEL, "converted": ready,
                     "path": str(folder), "size_mb": round(size / 2**20, 1), "wheel_cached": wheel})
    return rows


def add_models_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the listing as JSON")
    p.add_argument("--prepare", metavar="ALIAS", default=None,
                   help="convert this built-in alias now (otherwise it is converted on first use)")


def models_main(args: argparse.Namespace) -> int:
    if args.prepare is not None:  # `--prepare ""` (an unset variable) listed as if not given
        if args.prepare not in EMBEDDED:
            raise TargetError(f"--prepare {args.prepare!r}: not a built-in alias; choose from {sorted(EMBEDDED)}")
        ensure_embedded(args.prepare)
    rows = describe_models()
    if args.json:
        print(json.dumps({"cache": str(cache_dir()), "models": rows}, indent=2))
        return 0
    print(f"cache: {cache_dir()}  (set TOOLKIT_CACHE to move it)")
    print(f"{'alias':<24} {'default':<8} {'state':<28} source")
    for r in rows:
        state = f"converted ({r['size_mb']} MB)" if r["converted"] else (
            "wheel cached, not converted" if r["wheel_cached"] else "not fetched yet")
        print(f"{r['alias']:<24} {'yes' if r['default'] else '':<8} {state:<28} {r['source']} -> {r['original']}")
        if r["converted"]:
            print(f"{'':<24} path: {r['path']}")
    return 0
