"""Token maps from token counts: FR-Spec frequency lists and EAGLE-3 d2t/t2d vocab maps (docs/formats.md).

freq_{N}.pt        torch.save(list[int]) of N unique target ids, most frequent first, ties by lower id;
                   EOS and the chat template's special tokens are always in it.
vocab_map_{N}.safetensors
                   d2t int64[N]: draft id i -> target id i + d2t[i], draft ids ordered by target id;
                   t2d bool[V]: True where a target id is in the draft vocabulary.
token_counts.safetensors
                   counts int64[V] + string metadata (tokenizer, vocab hash, corpus, totals, mode).
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from safetensors import safe_open

from toolkit.atomic import atomic_path


class TokenMapError(ValueError):
    """A token-map request that cannot be met; the message says what is accepted."""


def check_sizes(sizes: list[int], vocab_size: int) -> None:
    for n in sizes:
        if n <= 0 or n > vocab_size:
            raise TokenMapError(f"--sizes: {n} is not a valid draft vocabulary size; each size must be in "
                                f"1..{vocab_size} (the target vocabulary)")


def freq_list(counts: np.ndarray, n: int, forced: list[int] = ()) -> list[int]:
    """The n most frequent ids (ties by id), with every `forced` id included, ordered by count desc, id asc."""
    check_sizes([n], len(counts))
    forced = np.unique(np.asarray(forced, dtype=np.int64))
    if len(forced) > n:
        raise TokenMapError(f"size {n} is smaller than the {len(forced)} special tokens that must be kept")
    order = np.lexsort((np.arange(len(counts)), -counts))  # count desc, then id asc
    rest = order[~np.isin(order, forced)][: n - len(forced)]
    chosen = np.concatenate([rest, forced])
    chosen = chosen[np.lexsort((chosen, -counts[chosen]))]
    return [int(i) for i in chosen]


def vocab_map(ids: list[int], vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """d2t int64[N] and t2d bool[V] for a draft vocabulary given as target ids."""
    target = torch.tensor(sorted(ids), dtype=torch.int64)
    if len(target) != len(set(ids)):
        raise TokenMapError("a draft vocabulary must not repeat ids")
    d2t = target - torch.arange(len(target), dtype=torch.int64)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[target] = True
    return d2t, t2d


def save_freq(path: Path, ids: list[int]) -> None:
    buf = io.BytesIO()  # through a buffer: the archive's inner name is then fixed, not the temp file's
    torch.save([int(i) for i in ids], buf)
    with atomic_path(path) as tmp:
        tmp.write_bytes(buf.getvalue())


def load_freq(path: str | Path) -> list[int]:
    if not Path(path).is_file():
        raise TokenMapError(f"token map {path}: file not found")
    try:
        ids = torch.load(path, weights_only=True)
    except Exception as e:  # torch raises several kinds for a file that is not a torch.save'd object
        raise TokenMapError(f"{path} is not a token map (a torch.save'd list of unique int token ids, "
                            f"freq_N.pt): {str(e).splitlines()[0][:120]}") from None
    if isinstance(ids, torch.Tensor):  # FR-Spec's own scripts save a tensor; accept it too
        ids = ids.tolist()
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and i >= 0 for i in ids) or \
            len(set(ids)) != len(ids):
        raise TokenMapError(f"{path}: a token map must hold a non-empty list of unique int token ids >= 0")
    return ids


def save_vocab_map(path: Path, d2t: torch.Tensor, t2d: torch.Tensor, metadata: dict[str, str]) -> None:
    with atomic_path(path) as tmp:
        save_file({"d2t": d2t.contiguous(), "t2d": t2d.contiguous()}, str(tmp), metadata=metadata)


def load_vocab_map(path: str | Path) -> tuple[torch.Tensor, torch.Tensor]:
    t = load_file(str(path))
    return t["d2t"], t["t2d"]


def save_counts(path: Path, counts: np.ndarray, metadata: dict) -> None:
    meta = {k: v if isinstance(v, str) else json.dumps(v) for k, v in metadata.items()}
    with atomic_path(path) as tmp:
        save_file({"counts": torch.from_numpy(counts.astype(np.int64))}, str(tmp), metadata=meta)


def load_counts(path: str | Path) -> tuple[np.ndarray, dict]:
    path = Path(path)
    if not path.is_file():
        raise TokenMapError(f"--from-counts {path}: file not found")
    try:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
            names = set(f.keys())
            counts = f.get_tensor("counts").numpy() if "counts" in names else None
    except Exception as e:  # safetensors' own error for a file that is not one
        raise TokenMapError(f"--from-counts {path}: not a safetensors file ({str(e)[:100]}); give the "
                            "token_counts.safetensors a build wrote") from None
    if counts is None:
        raise TokenMapError(f"--from-counts {path}: no 'counts' tensor; is it a token_counts.safetensors?")
    return counts, meta
