"""Training data: a prepared dataset (online mode) or hidden-state shards (offline mode), both indexed by the
prepared dataset's row, and a deterministic length-grouped batch order that can be resumed at any batch.

Batch order for epoch e: rows shuffled with seed + e, cut into mega-batches of 64 micro-batches, each sorted
by length (little padding) and cut into micro-batches, which are shuffled again. Process r of W takes
micro-batches r, r + W, ... of the epochs' stream, so a step's micro-batches on the W ranks are consecutive ones.
The order depends only on (seed, epoch), so skipping the first n micro-batches after a restart gives exactly the
batches an uninterrupted run sees.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Iterator

import torch

from toolkit.infer.weight_files import read_safetensors
from toolkit.json_files import read_json


class PreparedData:
    """Rows of a `toolkit prepare-data` folder: input_ids, loss_mask (docs/formats.md section 9)."""

    def __init__(self, folder: str | Path, max_len: int, key: str = "data"):
        """key: the config key that named the folder (data, eval_data), for the errors."""
        import datasets

        folder = Path(folder)
        if not (folder / "toolkit_prepare.json").is_file():
            what = "not a prepared dataset (no toolkit_prepare.json)" if folder.exists() else "no such folder"
            raise ValueError(f"{key} {folder}: {what}; run `toolkit prepare-data --out` first")
        self.meta, self.folder = read_json(folder / "toolkit_prepare.json", "prepared data"), folder
        ds = datasets.load_from_disk(str(folder))
        self.lengths = [min(n, max_len) for n in ds["num_tokens"]]
        self.ds = ds.with_format("torch", columns=["input_ids", "loss_mask"])
        self.max_len = max_len
        if not self.lengths or sum(self.lengths) == 0:
            raise ValueError(f"{key} {folder}: the dataset is empty")

    def __len__(self) -> int:
        return len(self.lengths)

    def check_ids(self, vocab_size: int, target: str) -> None:
        """Refuse rows whose token ids the target has no embedding for (data prepared with another tokenizer),
        before an IndexError deep in a forward. Arrow's max over the ids: a second per ~100M tokens."""
        import pyarrow.compute as pc

        top = pc.max(pc.list_flatten(self.ds.data.column("input_ids"))).as_py()
        if top is not None and top >= vocab_size:
            raise ValueError(f"data {self.folder}: token id {top} is beyond the target {target}'s vocabulary "
                             f"(vocab_size {vocab_size}); it was prepared with another tokenizer "
                             f"({self.meta.get('tokenizer') or self.meta.get('target')}): prepare it for this target")

    def __getitem__(self, row: int) -> dict:
        r = self.ds[row]
        return {"input_ids": r["input_ids"][:self.max_len].long(), "loss_mask": r["loss_mask"][:self.max_len].long()}

    def assistant_tokens(self, rows: list[int], chunk: int = 1 << 20) -> Iterator[torch.Tensor]:
        """The assistant-token ids of `rows` (the draft vocabulary is counted from them), in tensors of about
        `chunk` ids: a corpus's hundreds of millions of ids are never held at once."""
        out, held = [], 0
        for row in rows:
            r = self[row]
            out.append(r["input_ids"][r["loss_mask"].bool()])
            held += len(out[-1])
            if held >= chunk:
                yield torch.cat(out)
                out, held = [], 0
        if out:
            yield torch.cat(out)


def _check_index(path: Path, index) -> None:
    """An index.json of dump-hidden-states' layout (docs/formats.md section 8), or a ValueError naming it."""
    ok = isinstance(index, dict) and isinstance(index.get("shards"), list) and all(
        isinstance(s, dict) and {"file", "num_samples"} <= s.keys() for s in index["shards"]) and isinstance(
        index.get("aux_layer_ids"), list)
    if not ok:
        raise ValueError(f"hidden-state index {path}: not the layout `toolkit dump-hidden-states` writes (an object "
                         "with aux_layer_ids and a list of shards, each with file and num_samples); dump again")


def read_index(folder: Path) -> tuple[dict, list[tuple[Path, dict]]]:
    """(the dump's setup, [(folder, index.json)]): one folder's index, or those of its part-I-of-N folders
    (`dump-hidden-states --part`, torchrun), which must all be there and share one setup."""
    if (folder / "index.json").is_file():
        index = read_json(folder / "index.json", "hidden-state index")
        _check_index(folder / "index.json", index)
        return index, [(folder, index)]
    found = sorted(folder.glob("part-*-of-*/index.json")) if folder.is_dir() else []
    if not found:
        raise ValueError(f"hidden_states {folder}: no index.json, nor part-I-of-N folders holding one (run `toolkit "
                         "dump-hidden-states` first)")
    parts = [(p.parent, read_json(p, "hidden-state index")) for p in found]
    for p, index in parts:
        _check_index(p / "index.json", index)
    names = {p.name for p, _ in parts}
    counts = {int(name.rsplit("-of-", 1)[1]) for name in names}
    missing = sorted({f"part-{i}-of-{n}" for n in counts for i in range(n)} - names)
    if len(counts) > 1 or missing:
        raise ValueError(f"hidden_states {folder}: its parts do not make one dump (" + (
            f"parts of {sorted(counts)} processes" if len(counts) > 1 else f"{', '.join(missing)} missing") +
            "); finish the dump with the same --part count, or use another folder")
    setup = lambda index: {k: v for k, v in index.items() if k not in ("shards", "num_samples", "num_tokens")}  # noqa: E731
    first = setup(parts[0][1])
    for p, index in parts[1:]:
        if setup(index) != first:
            raise ValueError(f"hidden_states {folder}: {p.name} was dumped with another setup than {parts[0][0].name}")
    total = {k: sum(index[k] for _, index in parts) for k in ("num_samples", "num_tokens")}
    return {**first, **total, "shards": [s for _, index in parts for s in index["shards"]]}, parts


class HiddenStateShards:
    """Rows of `toolkit dump-hidden-states` shards (docs/formats.md section 8), read lazily (memory-mapped)."""

    def __init__(self, folder: str | Path, max_len: int):
        folder = Path(folder)
        self.index, parts = read_index(folder)
        self.where: dict[int, tuple[Path, int, int]] = {}
        for part, index in parts:
            for s in index["shards"]:
                with read_safetensors(part / s["file"], "hidden-state shard") as f:
                    ids, offs = f.get_tensor("sample_ids").tolist(), f.get_tensor("offsets").tolist()
                for j, row in enumerate(ids):
                    self.where[row] = (part / s["file"], offs[j], offs[j + 1])
        self.max_len = max_len

    def check_fits(self, name: str, data: PreparedData, data_name: str, rows: list[int], target: Path) -> None:
        """Refuse shards (the recipe's hidden_states `name`) that were not dumped from these training rows of
        `data`, at least max_len long, by this target folder."""
        from toolkit.models import same_target

        if not self.covers(len(rows)):
            raise ValueError(f"hidden_states {name} does not cover the {len(rows)} training rows of {data_name}; "
                             "dump them for this dataset")
        if self.index.get("max_len", self.max_len) < self.max_len:  # longer dumps are cut to max_len (first: a
            # shorter dump's rows are shorter than the data's, which would read as another dataset)
            raise ValueError(f"hidden_states {name} were dumped with max_len {self.index['max_len']}, training has "
                             f"max_len {self.max_len}: rows would be shorter than online; dump with at least the "
                             "training max_len")
        if why := self.differs_from(data, rows):
            raise ValueError(f"hidden_states {name} were not dumped from {data_name}: {why}; dump them for this "
                             "dataset")
        if not same_target(self.index["target_fingerprint"], target):
            raise ValueError(f"hidden_states {name} were dumped from another target ({self.index['target']})")

    def covers(self, rows: int) -> bool:
        return all(r in self.where for r in range(rows))

    def differs_from(self, data: PreparedData, rows: list[int], probes: int = 8) -> str | None:
        """Why these shards were not dumped from `data`'s rows, if they were not: every row's length (from the
        shards' offsets) and a few rows' tokens. Shards carry their own tokens, so training on another dataset's
        (a re-prepared one of as many rows) would run without an error, on the old data."""
        for r in rows:
            _, a, b = self.where[r]
            if min(b - a, self.max_len) != data.lengths[r]:
                return f"row {r} has {b - a} tokens there, {data.lengths[r]} in the data (at max_len {self.max_len})"
        for r in rows[:: max(1, len(rows) // probes)]:
            if not torch.equal(self[r]["input_ids"], data[r]["input_ids"]):
                return f"row {r} holds other tokens there than in the data"
        return None

    def __getitem__(self, row: int) -> dict:
        f, a, b = self.where[row]
        b = min(b, a + self.max_len)
        with read_safetensors(f, "hidden-state shard") as sf:
            get = lambda name: sf.get_slice(name)[a:b]  # noqa: E731
            return {"input_ids": get("input_ids").long(), "loss_mask": get("loss_mask").long(),
                    "aux": get("aux_hidden_states"), "final_hidden": get("final_hidden")}


def prefetch(items: Iterator) -> Iterator:
    """`items`, each produced on a background thread while the caller works on the one before: a training step's
    batches (offline: tens of MB per row read from the shards) are read while the last step computes."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1, thread_name_prefix="prefetch") as pool:
        ahead = pool.submit(next, items, StopIteration)
        while (item := ahead.result()) is not StopIteration:
            ahead = pool.submit(next, items, StopIteration)
            yield item


def batch_order(lengths: list[int], rows: list[int], batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """Micro-batches of row ids for one epoch (see the module docstring)."""
    rng = random.Random(seed * 1_000_003 + epoch)
    order = list(rows)
    rng.shuffle(order)
    mega = 64 * batch_size
    batches = []
    for s in range(0, len(order), mega):
        chunk = sorted(order[s:s + mega], key=lambda r: lengths[r])
        batches += [chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size)]
    rng.shuffle(batches)
    return batches


def micro_batches(lengths, rows, batch_size, seed, rank, world, skip: int = 0) -> Iterator[tuple[int, list[int]]]:
    """(epoch, rows) for this process forever, the first `skip` of its own skipped. The epochs' micro-batches
    make one stream and process r takes its items r, r + W, ...: dealt per epoch instead, an epoch of 11
    micro-batches gave rank 0 six and rank 1 five, so rank 1 ran ahead into the next epoch, a step could hold a
    row twice, and 2 ranks no longer trained as one process accumulating 2 micro-batches a step."""
    epoch, index, first = 0, 0, skip * world + rank  # index: the position in the stream of all ranks
    while True:
        order = batch_order(lengths, rows, batch_size, seed, epoch)
        if len(order) < world:
            raise ValueError(f"{len(rows)} training rows make {len(order)} micro-batches of {batch_size}, fewer than "
                             f"the {world} processes (one would have none); lower batch_size or add data")
        for b in order:
            if index >= first and (index - rank) % world == 0:
                yield epoch, b
            index += 1
        epoch += 1


def held_out(cfg, data: PreparedData) -> tuple[list[int], list[dict]]:
    """(training rows of data, evaluation rows): the first eval_samples rows of cfg.eval_data (a prepared folder)
    when given, all of data trained on; else data's last eval_samples rows, held back. A row cut at max_len before
    its answer has no prompt + answer to evaluate on: left out."""
    if cfg.eval_data:
        other = PreparedData(cfg.eval_data, cfg.max_len, "eval_data")
        if other.meta.get("target_fingerprint") != data.meta.get("target_fingerprint"):
            raise ValueError(f"eval_data {cfg.eval_data} was prepared for {other.meta.get('target')} and data "
                             f"{cfg.data} for {data.meta.get('target')}: prepare both for the target trained for")
        source, rows, train = other, range(min(cfg.eval_samples, len(other))), list(range(len(data)))
    else:
        if cfg.eval_samples >= len(data):
            raise ValueError(f"eval_samples {cfg.eval_samples} leaves no training rows of the {len(data)} in "
                             f"{cfg.data}; give fewer, or eval_data (a prepared folder to evaluate on)")
        source, rows = data, range(len(data) - cfg.eval_samples, len(data))
        train = list(range(len(data) - cfg.eval_samples))
    # a row's first two tokens are never predicted (step 0 at row t predicts t + 2): stop at the first row with a
    # token to learn; only data whose answers all lie past max_len is read through, to be refused
    if not any(data[r]["loss_mask"][2:].any() for r in train):
        raise ValueError(f"max_len {cfg.max_len}: no training row of {cfg.data} keeps an assistant (loss_mask) "
                         "token within it, so nothing would be learned; raise max_len")
    held = [source[r] for r in rows if source[r]["loss_mask"].any()]
    if cfg.eval_samples and not held:
        raise ValueError(f"none of the {cfg.eval_samples} evaluation rows keeps an assistant token within max_len "
                         f"{cfg.max_len}; raise max_len or eval_samples")
    return train, held


def collate(items: list[dict]) -> dict:
    """Right-pad to the longest row: input_ids 0, loss_mask 0, valid False (keys never attended)."""
    L = max(len(x["input_ids"]) for x in items)
    out = {"input_ids": torch.zeros(len(items), L, dtype=torch.long),
           "loss_mask": torch.zeros(len(items), L, dtype=torch.long),
           "valid": torch.zeros(len(items), L, dtype=torch.bool)}
    for k in ("aux", "final_hidden"):
        if k in items[0]:
            out[k] = torch.zeros(len(items), L, items[0][k].shape[-1], dtype=items[0][k].dtype)
    for i, x in enumerate(items):
        n = len(x["input_ids"])
        out["valid"][i, :n] = True
        for k in out:
            if k != "valid":
                out[k][i, :n] = x[k]
    return out
