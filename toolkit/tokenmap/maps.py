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
import sys
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


def fit_counts(counts: np.ndarray, vocab_size: int, where: str) -> np.ndarray:
    """The same tokenizer's counts for another V (a --tokenizer run reused for a padded target, whose config's
    vocab_size exceeds the tokenizer): ids no text ever tokenized to get zeros, or are dropped while zero."""
    if len(counts) <= vocab_size:
        return np.concatenate([counts, np.zeros(vocab_size - len(counts), dtype=counts.dtype)])
    beyond = np.flatnonzero(counts[vocab_size:])
    if len(beyond):
        raise TokenMapError(f"{where}: token id {vocab_size + int(beyond[0])} was counted, but the target's "
                            f"vocabulary has {vocab_size} ids (counts have {len(counts)}): the tokenizer and "
                            f"the target disagree")
    return counts[:vocab_size]


def check_ids_fit(ids: list[int], vocab_size: int, where: str) -> None:
    """Target ids of a draft vocabulary must index the target's logits (its config's vocab_size rows)."""
    top = max(ids, default=-1)
    if top >= vocab_size:
        raise TokenMapError(f"{where}: target id {top} is beyond the target's vocabulary (config.json vocab_size "
                            f"{vocab_size}: ids must be in 0..{vocab_size - 1}); was it made with another "
                            f"tokenizer or target?")


def check_vocab_map(d2t: torch.Tensor, t2d: torch.Tensor, vocab_size: int, where: str) -> None:
    """A vocab map used with a target: t2d has the target config's vocab_size entries (training indexes it with
    the target's argmax ids) and marks exactly d2t's ids, which are ascending (training takes them from t2d)."""
    if len(t2d) != vocab_size:
        raise TokenMapError(
            f"{where}: t2d has {len(t2d)} entries, but the target's vocabulary (config.json vocab_size) is "
            f"{vocab_size}. A map built from a tokenizer alone has the tokenizer's size, which a padded target "
            f"exceeds (Qwen2.5: 151665 vs 151936); rebuild it with `toolkit build-token-map --model FOLDER` "
            f"(the target's config.json and tokenizer files suffice; --from-counts reuses its counts)")
    ids = torch.arange(len(d2t)) + d2t.long()
    if len(ids) == 0:
        raise TokenMapError(f"{where}: d2t is empty; a draft vocabulary needs at least one id")
    check_ids_fit([int(ids.max())], vocab_size, where)
    if int(ids.min()) < 0 or bool((ids[1:] <= ids[:-1]).any()):
        raise TokenMapError(f"{where}: d2t must map draft ids to ascending, unique target ids >= 0 "
                            f"(docs/formats.md section 5)")
    if int(t2d.sum()) != len(ids) or not bool(t2d[ids].all()):
        raise TokenMapError(f"{where}: t2d marks {int(t2d.sum())} ids, not the {len(ids)} target ids of d2t")


def freq_list(counts: np.ndarray, n: int, forced: list[int] = ()) -> list[int]:
    """The n most frequent ids (ties by id), with every `forced` id included, ordered by count desc, id asc."""
    check_sizes([n], len(counts))
    forced = np.unique(np.asarray(forced, dtype=np.int64))
    check_ids_fit(forced.tolist(), len(counts), "the special tokens to keep")
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


def _missing(path: Path, what: str, file: str) -> str:
    """Why `path` is no file: a folder (name the file in it that was meant) or nothing there."""
    if Path(path).is_dir():
        return f"{what} {path}: is a folder; give the {file} file (build-token-map writes it there)"
    return f"{what} {path}: file not found"


def load_freq(path: str | Path) -> list[int]:
    if not Path(path).is_file():
        raise TokenMapError(_missing(path, "token map", "freq_N.pt or vocab_map_N.safetensors"))
    with open(path, "rb") as f:
        head = f.read(9)
    if len(head) == 9 and head[8:9] == b"{":  # a safetensors file: u64 header length, then its JSON header
        raise TokenMapError(f"{path} is a safetensors file (an EAGLE-3 vocab_map_N.safetensors or raw counts); "
                            "a token map here is FR-Spec's freq_N.pt, which toolkit build-token-map writes beside "
                            "it")
    try:
        ids = torch.load(path, weights_only=True)
    except Exception as e:  # torch raises several kinds for a file that is not a torch.save'd object
        raise TokenMapError(f"{path} is not a token map (a torch.save'd list of unique int token ids, "
                            f"freq_N.pt): {str(e).splitlines()[0][:120]}") from None
    if isinstance(ids, torch.Tensor):  # FR-Spec's own scripts save a tensor; accept it too
        ids = ids.tolist()
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                       for i in ids):
        raise TokenMapError(f"{path}: a token map must hold a non-empty list of int token ids >= 0")
    unique = list(dict.fromkeys(ids))  # FR-Spec's fr.py appends encode(eos), BOS included: its maps repeat ids
    if len(unique) != len(ids):
        print(f"[token map] {path}: {len(ids) - len(unique)} repeated id(s) dropped (FR-Spec's fr.py appends "
              f"the tokenizer's encoding of EOS, BOS included); {len(unique)} unique ids kept", file=sys.stderr)
    return unique


def save_vocab_map(path: Path, d2t: torch.Tensor, t2d: torch.Tensor, metadata: dict[str, str]) -> None:
    with atomic_path(path) as tmp:
        save_file({"d2t": d2t.contiguous(), "t2d": t2d.contiguous()}, str(tmp), metadata=metadata)


def load_vocab_map(path: str | Path) -> tuple[torch.Tensor, torch.Tensor]:
    if not Path(path).is_file():
        raise TokenMapError(_missing(path, "token map", "vocab_map_N.safetensors"))
    try:
        t = load_file(str(path))
    except Exception as e:  # safetensors' own error for a file that is not one
        raise TokenMapError(f"token map {path}: not a safetensors file ({str(e)[:100]}); give a "
                            f"vocab_map_N.safetensors") from None
    if "d2t" not in t or "t2d" not in t:
        raise TokenMapError(f"token map {path}: holds {sorted(t)}, not the d2t and t2d tensors of a "
                            f"vocab_map_N.safetensors")
    return t["d2t"], t["t2d"]


def save_counts(path: Path, counts: np.ndarray, metadata: dict) -> None:
    meta = {k: v if isinstance(v, str) else json.dumps(v) for k, v in metadata.items()}
    with atomic_path(path) as tmp:
        save_file({"counts": torch.from_numpy(counts.astype(np.int64))}, str(tmp), metadata=meta)


def load_counts(path: str | Path) -> tuple[np.ndarray, dict]:
    path = Path(path)
    if not path.is_file():
        raise TokenMapError(_missing(path, "--from-counts", "token_counts.safetensors"))
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
    if counts.ndim != 1 or not np.issubdtype(counts.dtype, np.integer) or (counts < 0).any() or counts.sum() == 0:
        raise TokenMapError(f"--from-counts {path}: its counts ({counts.dtype}, shape {list(counts.shape)}) are not "
                            "one non-negative integer count per token id with some tokens counted, as a build writes "
                            "them")
    return counts, meta
