"""`toolkit dump-hidden-states`: run the frozen target once over a prepared dataset and write the shards that
offline training reads (docs/formats.md section 8): per token, the three aux hidden states and the final
normed hidden state (target logits are recomputed from it in training, 100x smaller than logits).

    toolkit dump-hidden-states --data out/prepared --out out/hidden --dtype bfloat16

Shards are written atomically and `index.json` is rewritten after each one, so a killed run resumes after
the last listed shard.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from toolkit.embedded import DEFAULT_MODEL


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help=f"target (default: the prepared data's, else {DEFAULT_MODEL})")
    p.add_argument("--data", required=True, help="prepared dataset folder (toolkit prepare-data)")
    p.add_argument("--out", required=True, help="shards folder")
    p.add_argument("--aux-layers", default=None, help="comma-separated target layer ids (default [1, L//2-1, L-4])")
    p.add_argument("--max-len", type=int, default=2048, help="tokens per sample (as in training)")
    p.add_argument("--batch-size", type=int, default=4, help="sequences per target forward")
    p.add_argument("--shard-size", type=int, default=512, help="samples per shard")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="stored dtype")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="auto: cuda if available")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")


def main(args: argparse.Namespace) -> int:
    from safetensors.torch import save_file
    from tqdm import tqdm

    from toolkit.atomic import atomic_path, check_out_path, write_text
    from toolkit.infer.drafts import aux_layer_problems
    from toolkit.infer.loading import load_target
    from toolkit.models import fingerprint, resolve_target, same_target
    from toolkit.train.data import PreparedData

    if args.threads is not None and args.threads < 0:
        raise ValueError(f"--threads {args.threads}: give a number of CPU threads >= 1 (0 or none: torch's)")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.batch_size < 1 or args.shard_size < 1:
        raise ValueError("--batch-size and --shard-size must be at least 1")
    if args.max_len < 2:
        raise ValueError(f"--max-len {args.max_len}: give the tokens per sample training uses, at least 2")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise ValueError(f"--out {args.out} is a file; give a folder for the shards (made if absent)")
    check_out_path("--out", args.out, folder=True)
    try:
        asked = [int(x) for x in args.aux_layers.split(",")] if args.aux_layers else None
    except ValueError:
        raise ValueError(f"--aux-layers {args.aux_layers!r}: give 3 comma-separated layer ids, e.g. 1,14,26") from None
    data = PreparedData(args.data, args.max_len)
    model = args.model or data.meta.get("target") or DEFAULT_MODEL
    folder = resolve_target(model)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    run_dtype = torch.bfloat16 if device == "cuda" else torch.float32
    target = load_target(folder, run_dtype, device)
    # a sliding window or a length-dependent rope: rows beyond it would be dumped wrong, refused before the first
    target.config.check_sequence(max(data.lengths))
    aux_layers = asked or target.config.default_aux_layers()
    if len(aux_layers) != 3 or not all(0 <= i < target.config.num_layers for i in aux_layers):
        raise ValueError(f"--aux-layers {aux_layers}: give 3 layer ids in 0..{target.config.num_layers - 1}")
    for note in aux_layer_problems(aux_layers, target.config.num_layers):
        if args.aux_layers:  # a head trained on these could not be served by SGLang / vLLM as it was trained
            raise ValueError(f"--aux-layers: {note}")
        print(f"WARNING: the default aux layers of this {target.config.num_layers}-layer target: {note}",
              file=sys.stderr)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    head = {"format_version": 1, "target": model, "target_fingerprint": fingerprint(folder),
            "dataset": str(Path(args.data).resolve()), "aux_layer_ids": aux_layers, "hidden_size": target.config.hidden_size,
            "dtype": args.dtype, "max_len": args.max_len}
    index = json.loads((out / "index.json").read_text()) if (out / "index.json").exists() else None
    def same(k) -> bool:  # the target by its weights, not by how it was named; the data folder by where it is
        if k == "target_fingerprint" and index.get(k):
            return same_target(index[k], folder)  # also an id of the older rule
        if k == "target":
            return index.get("target_fingerprint") is not None and same_target(index["target_fingerprint"], folder)
        if k == "dataset" and index.get(k):
            return Path(index[k]).resolve() == Path(head[k])  # folders dumped before paths were resolved
        return False

    differ = [k for k in head if index is not None and index.get(k) != head[k] and not same(k)]
    if differ:
        raise ValueError(f"--out {out} holds shards of another setup (" + ", ".join(
            f"{k} {index.get(k)!r} there, {head[k]!r} now" for k in differ) + "); use a new folder")
    shards = index["shards"] if index else []
    store = getattr(torch, args.dtype)
    # resume after the rows the listed shards hold: len(shards) x --shard-size would skip rows (or dump some
    # twice) when the resumed command gives another --shard-size
    starts = range(sum(s["num_samples"] for s in shards), len(data), args.shard_size)
    for first in tqdm(starts, desc="shards", unit="shard"):
        rows = list(range(first, min(first + args.shard_size, len(data))))
        parts = {k: [] for k in ("input_ids", "loss_mask", "aux_hidden_states", "final_hidden")}
        for s in range(0, len(rows), args.batch_size):
            items = [data[r] for r in rows[s:s + args.batch_size]]
            width = max(len(x["input_ids"]) for x in items)
            ids = torch.stack([torch.nn.functional.pad(x["input_ids"], (0, width - len(x["input_ids"])))
                               for x in items]).to(device)
            with torch.no_grad():
                _, hs = target(ids, aux_layers=aux_layers + [-1])
            for b, x in enumerate(items):
                n = len(x["input_ids"])
                parts["input_ids"].append(x["input_ids"])
                parts["loss_mask"].append(x["loss_mask"].to(torch.uint8))
                parts["aux_hidden_states"].append(torch.cat(hs[:3], -1)[b, :n].to(store).cpu())
                parts["final_hidden"].append(hs[3][b, :n].to(store).cpu())
        lengths = torch.tensor([len(x) for x in parts["input_ids"]])
        tensors = {k: torch.cat(v).contiguous() for k, v in parts.items()}
        tensors["sample_ids"] = torch.tensor(rows, dtype=torch.int64)
        tensors["offsets"] = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        name = f"shard-{len(shards):05d}.safetensors"
        with atomic_path(out / name) as tmp:
            save_file(tensors, str(tmp))
        shards.append({"file": name, "first_sample": rows[0], "num_samples": len(rows),
                       "num_tokens": int(lengths.sum())})
        write_text(out / "index.json", json.dumps({**head, "num_samples": sum(s["num_samples"] for s in shards),
                                                   "num_tokens": sum(s["num_tokens"] for s in shards),
                                                   "shards": shards}, indent=2) + "\n")
    print(f"dump-hidden-states: {len(shards)} shards for {len(data)} samples in {out}", file=sys.stderr)
    return 0
