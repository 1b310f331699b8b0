"""`toolkit dump-hidden-states`: run the frozen target once over a prepared dataset and write the shards that
offline training reads (docs/formats.md section 8): per token, the three aux hidden states and the final
normed hidden state (target logits are recomputed from it in training, 100x smaller than logits).

    toolkit dump-hidden-states --data out/prepared --out out/hidden --dtype bfloat16

Shards are written atomically and `index.json` is rewritten after each one, so a killed run resumes after
the last listed shard. Several GPUs split the rows: `torchrun --nproc_per_node 8 -m toolkit.cli dump-hidden-states
...` (or `--part I/N` per process) writes OUT/part-I-of-N folders, which training reads as one.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import torch

from toolkit.cpu_speed import threads_problem
from toolkit.embedded import DEFAULT_MODEL


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help=f"target (default: the prepared data's, else {DEFAULT_MODEL})")
    p.add_argument("--data", required=True, help="prepared dataset folder (toolkit prepare-data)")
    p.add_argument("--out", required=True, help="shards folder")
    p.add_argument("--aux-layers", default=None, help="comma-separated target layer ids (default [1, L//2-1, L-4])")
    p.add_argument("--max-len", type=int, default=2048, help="tokens per sample (as in training)")
    p.add_argument("--batch-size", type=int, default=4, help="sequences per target forward")
    p.add_argument("--shard-size", type=int, default=512, help="samples per shard")
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"],
                   help="stored dtype; auto: float16 where the target runs in it (a GPU before sm_80), else "
                        "bfloat16; float32: the target run in float32 too (one that overflows float16)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="auto: cuda if available")
    p.add_argument("--part", default=None, metavar="I/N",
                   help="dump rows I, I+N, ... into OUT/part-I-of-N (training reads the N parts as one); under "
                        "torchrun the default is RANK/WORLD_SIZE, on GPU LOCAL_RANK")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")


def main(args: argparse.Namespace) -> int:
    from safetensors.torch import save_file
    from tqdm import tqdm

    from toolkit.atomic import atomic_path, check_out_path, write_text
    from toolkit.infer.draft_checks import aux_layer_problems
    from toolkit.infer.loading import load_target
    from toolkit.models import fingerprint, resolve_target, same_target
    from toolkit.train.data import PreparedData
    from toolkit.train.precision import target_dtype

    if problem := threads_problem(args.threads):
        raise ValueError(problem)
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
    part, parts = parse_part(args.part)
    data = PreparedData(args.data, args.max_len)
    model = args.model or data.meta.get("target") or DEFAULT_MODEL
    folder = resolve_target(model)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    if device == "cuda" and "LOCAL_RANK" in os.environ:  # torchrun: one GPU per process
        device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
    # the GPU's half precision (fp16 before sm_80), fp32 on a CPU; float32 asked for: computed so too
    run_dtype = torch.float32 if args.dtype == "float32" else target_dtype("auto", torch.device(device), "no")
    if args.dtype == "auto":  # fp16 states kept as computed; rounded to bf16 they would lose 3 mantissa bits
        args.dtype = "float16" if run_dtype == torch.float16 else "bfloat16"
    from toolkit.infer.config import ModelConfig

    data.check_ids(ModelConfig.from_folder(folder).vocab_size, model)  # data prepared with another tokenizer
    target = load_target(folder, run_dtype, device)
    # a length-dependent rope: rows beyond its exact length would be dumped wrong, refused before the first
    target.config.check_sequence(max(data.lengths))
    aux_layers = asked or target.config.default_aux_layers()
    if len(aux_layers) != 3 or not all(0 <= i < target.config.num_layers for i in aux_layers):
        raise ValueError(f"--aux-layers {aux_layers}: give 3 increasing layer ids in 0..{target.config.num_layers - 2} "
                         "(SGLang and vLLM capture the input of layer id + 1)")
    for note in aux_layer_problems(aux_layers, target.config.num_layers):
        if args.aux_layers:  # a head trained on these could not be served by SGLang / vLLM as it was trained
            raise ValueError(f"--aux-layers: {note}")
        print(f"WARNING: the default aux layers of this {target.config.num_layers}-layer target: {note}",
              file=sys.stderr)
    out = Path(args.out) / (f"part-{part}-of-{parts}" if parts > 1 else "")
    out.mkdir(parents=True, exist_ok=True)
    H = target.config.hidden_size
    head = {"format_version": 1, "target": model, "target_fingerprint": fingerprint(folder),
            "dataset": str(Path(args.data).resolve()), "aux_layer_ids": aux_layers, "hidden_size": H,
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
    shards = readable(out, index["shards"] if index else [])
    store = getattr(torch, args.dtype)
    # this part's rows, resumed after the ones its listed shards hold: len(shards) x --shard-size would skip rows
    # (or dump some twice) when the resumed command gives another --shard-size
    rows = list(range(part, len(data), parts))[sum(s["num_samples"] for s in shards):]
    per_token = 4 * H * store.itemsize + 9  # 3 aux states + the final one, an int64 id and a uint8 mask
    need, free = sum(data.lengths[r] for r in rows) * per_token, shutil.disk_usage(out).free
    print(f"dump-hidden-states: {len(rows)} rows to dump into {out}, {need / 1e9:.1f} GB ({per_token} bytes a "
          f"token); {free / 1e9:.1f} GB free there", file=sys.stderr)
    if need > free:
        raise ValueError(f"--out {out}: the shards need {need / 1e9:.1f} GB and the disk has {free / 1e9:.1f} GB "
                         "free; free space or give a folder on a larger disk (what is dumped is kept: rerun to resume)")
    for first in tqdm(range(0, len(rows), args.shard_size), desc="shards", unit="shard"):
        window = rows[first:first + args.shard_size]
        tensors = dump_shard(target, data, window, aux_layers, args.batch_size, store, device)
        name = f"shard-{len(shards):05d}.safetensors"
        with atomic_path(out / name) as tmp:
            save_file(tensors, str(tmp))
        shards.append({"file": name, "first_sample": window[0], "num_samples": len(window),
                       "num_tokens": int(tensors["offsets"][-1])})
        write_text(out / "index.json", json.dumps({**head, "num_samples": sum(s["num_samples"] for s in shards),
                                                   "num_tokens": sum(s["num_tokens"] for s in shards),
                                                   "shards": shards}, indent=2) + "\n")
    print(f"dump-hidden-states: {len(shards)} shards for {sum(s['num_samples'] for s in shards)} samples in {out}",
          file=sys.stderr)
    return 0


def parse_part(text: str | None) -> tuple[int, int]:
    """'I/N' -> (I, N); None -> torchrun's RANK / WORLD_SIZE, else (0, 1)."""
    from toolkit.split import parse_split

    if text is None:
        return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    return parse_split(text, "--part", "0/8 ... 7/8 for eight processes")


@torch.no_grad()
def readable(out: Path, shards: list[dict]) -> list[dict]:
    """The listed shards a resumed dump keeps: those before the first missing or unreadable one (a file cut short
    by a copy or a full disk after it was listed); that one and the rest are dumped again, under the same names."""
    from toolkit.infer.weight_files import read_safetensors

    for i, shard in enumerate(shards):
        try:
            with read_safetensors(out / shard["file"], "shard"):
                pass
        except (ValueError, OSError) as err:
            why = err if isinstance(err, ValueError) else f"{shard['file']}: {err.strerror}"
            print(f"dump-hidden-states: {why}; resuming from it: {len(shards) - i} listed shard(s) dumped again",
                  file=sys.stderr)
            return shards[:i]
    return shards


def dump_shard(target, data, rows: list[int], aux_layers: list[int], batch_size: int, store: torch.dtype,
               device) -> dict[str, torch.Tensor]:
    """One shard's tensors (docs/formats.md section 8), written into tensors allocated once (a list of rows joined
    at the end held every state twice: 2x the shard in host memory). Rows go through the target sorted by length,
    so a batch pads little; `sample_ids` records the order."""
    rows = sorted(rows, key=lambda r: data.lengths[r])
    lengths = torch.tensor([data.lengths[r] for r in rows])
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    T, H = int(offsets[-1]), target.config.hidden_size
    out = {"input_ids": torch.empty(T, dtype=torch.int64), "loss_mask": torch.empty(T, dtype=torch.uint8),
           "aux_hidden_states": torch.empty(T, 3 * H, dtype=store), "final_hidden": torch.empty(T, H, dtype=store)}
    for s in range(0, len(rows), batch_size):
        items = [data[r] for r in rows[s:s + batch_size]]
        width = max(len(x["input_ids"]) for x in items)
        ids = torch.stack([torch.nn.functional.pad(x["input_ids"], (0, width - len(x["input_ids"])))
                           for x in items]).to(device)
        # logits at one position only: the full [B, T, V] projection would be computed and thrown away
        _, hs = target(ids, aux_layers=aux_layers + [-1], logits_at=torch.zeros(len(items), dtype=torch.long,
                                                                                  device=ids.device))
        if not all(bool(torch.isfinite(h).all()) for h in hs):  # inf / nan shards would train a nan head
            raise ValueError(f"rows {rows[s:s + batch_size]}: the target's hidden states are not finite (its "
                             f"{str(hs[0].dtype).removeprefix('torch.')} range overflowed); give --dtype float32, "
                             "which runs the target in float32 too")
        fused = torch.cat(hs[:3], -1).to(store).cpu()                    # [B, T, 3H]
        final = hs[3].to(store).cpu()                                    # [B, T, H]
        for b, x in enumerate(items):
            a, n = int(offsets[s + b]), len(x["input_ids"])
            out["input_ids"][a:a + n] = x["input_ids"]
            out["loss_mask"][a:a + n] = x["loss_mask"]
            out["aux_hidden_states"][a:a + n] = fused[b, :n]
            out["final_hidden"][a:a + n] = final[b, :n]
    return {**out, "sample_ids": torch.tensor(rows, dtype=torch.int64), "offsets": offsets}
