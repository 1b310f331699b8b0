"""`toolkit build-token-map`: count tokens over a corpus, then write FR-Spec and EAGLE-3 token maps.

    toolkit build-token-map --data train.jsonl --sizes 8192,16384,32768 --out maps/ [--assistant-only]
    toolkit build-token-map --from-counts maps/token_counts.safetensors --sizes 4096 --out maps/

Nothing is written until counting has finished, and every file is written atomically.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import time
from pathlib import Path

from toolkit.atomic import atomic_path
from toolkit.data.chat import ChatRenderer
from toolkit.data.tokenizer import BUILTIN_TEMPLATES, load_tokenizer
from toolkit.embedded import DEFAULT_MODEL, sha256_file
from toolkit.infer.family_keys import text_config
from toolkit.models import fingerprint, resolve_target
from toolkit.tokenmap.count import count_tokens, usable_cpus
from toolkit.tokenmap.folder import earlier_maps
from toolkit.tokenmap.maps import (TokenMapError, check_sizes, fit_counts, freq_list, load_counts,
                                   save_counts, save_freq, save_vocab_map, vocab_map)
from toolkit.tokenmap.report import write_coverage

FORMAT_VERSION = "1"


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise TokenMapError(f"--sizes {text!r}: give comma-separated integers, e.g. 8192,16384,32768") from None
    if not sizes:
        raise TokenMapError("--sizes: give at least one size, e.g. 8192,16384,32768")
    return sorted(set(sizes))


def add_args(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", default=DEFAULT_MODEL,
                     help="target whose tokenizer and vocabulary size are used: HF folder, hub id or alias")
    src.add_argument("--tokenizer", default=None,
                     help="a tokenizer.json file or tokenizer folder instead of --model. V (t2d's length) and the "
                          "stop ids kept come from the folder's config.json / generation_config.json when it has "
                          "them, else from the tokenizer alone (its size, EOS and end-of-turn tokens), too short "
                          "for a target whose config pads the vocabulary (Qwen2.5): give --model then")
    p.add_argument("--chat-template", default=None,
                   help=f"built-in template ({', '.join(BUILTIN_TEMPLATES)}) or a .jinja file; default: the "
                        f"tokenizer's own, else inferred from its special tokens")
    p.add_argument("--data", nargs="+", default=None, metavar="FILE",
                   help="corpus files: .jsonl/.json (messages, conversations, alpaca, gpteacher, "
                        "question/answer, turns, text), .txt, .parquet, or a datasets folder")
    p.add_argument("--sizes", default="8192,16384,32768", help="comma-separated draft vocabulary sizes")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--assistant-only", action="store_true",
                   help="count only assistant tokens (+ end-of-turn), what EAGLE-3 trains on")
    p.add_argument("--max-tokens", type=int, default=None, help="stop after counting this many tokens")
    p.add_argument("--num-workers", type=int, default=usable_cpus(),
                   help="tokenizer threads (sets RAYON_NUM_THREADS before the tokenizer starts) and "
                        "piece-counting processes")
    p.add_argument("--no-piece-cache", action="store_true",
                   help="tokenize every text even where counting by distinct pieces is exact (byte-level BPE)")
    p.add_argument("--batch-size", type=int, default=2048, help="samples per tokenizer batch")
    p.add_argument("--from-counts", default=None, metavar="token_counts.safetensors",
                   help="re-derive maps from saved counts instead of tokenizing --data again")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def vocab_hash(tok) -> str:
    items = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256("\n".join(f"{i}\t{t}" for t, i in items).encode()).hexdigest()[:16]


def model_folder(args) -> Path | None:
    """The folder of the target's config.json and generation_config.json: --model's, or a --tokenizer folder
    holding a config.json (a model folder given as a tokenizer); None for a lone tokenizer."""
    if args.tokenizer is None:
        return resolve_target(args.model)
    path = Path(args.tokenizer).expanduser()
    return path if (path / "config.json").is_file() else None


def target_vocab_size(folder: Path | None, tok) -> int:
    """V of t2d and of the counts: the target config's vocab_size, the rows of its logits, which may be padded
    beyond the tokenizer (Qwen2.5: 151936 vs 151665) or fall short of tokens added to it; without a config,
    the tokenizer's size."""
    if folder is None:
        return len(tok)
    cfg = json.loads((folder / "config.json").read_text())
    size = text_config(cfg).get("vocab_size")  # gemma-3-4b-it's text_config has none: its class's 262208
    if size is None:
        print(f"note: {folder}/config.json has no vocab_size; sizing the maps by the tokenizer ({len(tok)})")
        return len(tok)
    return int(size)


def kept_ids(tok, renderer, folder: Path | None, vocab_size: int) -> list[int]:
    """Ids every map keeps: EOS, the template's special tokens, the tokenizer's end-of-turn tokens and, with a
    model folder, every id its generation config stops on; each must be a target id."""
    from toolkit.infer.loading import stop_ids

    forced = sorted(set(renderer.template_special_ids()) | stop_ids(tok, folder))
    if forced and forced[-1] >= vocab_size:
        raise TokenMapError(f"special token id {forced[-1]} (of {forced}) is beyond the target's vocabulary "
                            f"(config.json vocab_size {vocab_size}; the tokenizer has {len(tok)} ids): the "
                            f"tokenizer does not belong to this target")
    return forced


def corpus_sha256(path: Path) -> str:
    if path.is_file():
        return sha256_file(path)
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(f"{f.relative_to(path)}:{sha256_file(f)}".encode())
    return h.hexdigest()


def _count(args, tok, renderer, vocab_size: int):
    if not args.data:
        raise TokenMapError("give --data FILE [FILE ...] (or --from-counts token_counts.safetensors)")
    missing = [f for f in args.data if not Path(f).exists()]
    if missing:
        raise TokenMapError(f"--data: not found: {', '.join(missing)}")
    if args.max_tokens is not None and args.max_tokens <= 0:
        raise TokenMapError(f"--max-tokens {args.max_tokens}: must be a positive number of tokens")
    mode = "assistant" if args.assistant_only else "all"
    res = count_tokens(args.data, renderer, vocab_size, mode, args.max_tokens, args.batch_size, not args.quiet,
                       args.num_workers, pieces=not args.no_piece_cache)
    for s in res.files:
        s.warn_bad()
    if res.skipped_text:
        print(f"note: {res.skipped_text} plain-text samples have no assistant turn and were not counted")
    if res.total == 0:
        read = sum(s.samples for s in res.files)
        raise TokenMapError(f"empty corpus: no tokens counted in {', '.join(args.data)} ({read} samples read"
                            f"{', counting only assistant tokens' if args.assistant_only else ''})")
    print(f"counted {res.total:,} tokens from {sum(s.samples for s in res.files):,} samples in {res.seconds:.1f} s "
          f"({res.total / max(res.seconds, 1e-9):,.0f} tok/s)")
    meta = {"format_version": FORMAT_VERSION, "tokenizer": tok.name_or_path, "vocab_hash": vocab_hash(tok),
            "vocab_size": vocab_size, "chat_template": tok.template_name, "mode": mode,
            "total_tokens": res.total, "max_tokens": args.max_tokens, "method": res.method,
            "target_fingerprint": None if args.tokenizer else fingerprint(resolve_target(args.model)),
            "corpus": [{"path": s.path, "sha256": corpus_sha256(Path(s.path)), "records": s.records,
                        "samples": s.samples, "bad": s.bad} for s in res.files]}
    return res.counts, meta


def _from_counts(args, tok, vocab_size: int):
    counts, meta = load_counts(args.from_counts)
    ours = vocab_hash(tok)
    if meta.get("vocab_hash") is None:
        raise TokenMapError(f"--from-counts {args.from_counts} holds no build metadata (its vocab_hash): not a "
                            "counts file build-token-map wrote, so which tokenizer counted it is unknown; count the "
                            "corpus again with --data")
    if meta.get("vocab_hash") != ours:
        raise TokenMapError(
            f"--from-counts {args.from_counts} was counted with tokenizer {meta.get('tokenizer')!r} (vocab "
            f"hash {meta.get('vocab_hash')}, V={len(counts)}), but the tokenizer given is {tok.name_or_path!r} "
            f"(vocab hash {ours}, V={vocab_size}); pass the same --model/--tokenizer")
    if len(counts) == vocab_size:
        return counts, meta, False
    # the same tokenizer, another target size (counted with --tokenizer alone, now for a padded --model)
    print(f"note: {args.from_counts} has {len(counts)} counts; sized to the target's vocabulary ({vocab_size})")
    counts = fit_counts(counts, vocab_size, f"--from-counts {args.from_counts}")
    return counts, {**meta, "vocab_size": vocab_size}, True


def build(args: argparse.Namespace) -> dict:
    """Do the work of `toolkit build-token-map`; returns what was written, coverage and phase timings."""
    if args.num_workers is not None:
        if args.num_workers <= 0:
            raise TokenMapError(f"--num-workers {args.num_workers}: must be >= 1")
        cpus = usable_cpus()
        if args.num_workers > 4 * cpus:  # each is a thread and a forked process: thousands exhaust the machine
            raise TokenMapError(f"--num-workers {args.num_workers}: this machine gives the process {cpus} CPUs; "
                                f"give 1..{4 * cpus} (counting is CPU-bound: more workers than CPUs do not help)")
        os.environ["RAYON_NUM_THREADS"] = str(args.num_workers)  # read once, when the thread pool starts
    if args.from_counts and args.data:
        raise TokenMapError("give either --data (count now) or --from-counts (reuse counts), not both")
    if args.batch_size < 1:  # 0 never filled a batch: the whole corpus went to the tokenizer at once
        raise TokenMapError(f"--batch-size {args.batch_size}: must be >= 1 samples per tokenizer batch")
    sizes = parse_sizes(args.sizes)
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise TokenMapError(f"--out {args.out} is a file; give a folder (made if absent) for the maps")
    from toolkit.atomic import check_out_path

    check_out_path("--out", args.out, folder=True)  # a file above it failed only after the counting
    t0 = time.perf_counter()
    tok = load_tokenizer(args.model if args.tokenizer is None else None, args.tokenizer, args.chat_template)
    folder = model_folder(args)
    vocab_size = target_vocab_size(folder, tok)
    check_sizes(sizes, vocab_size)
    renderer = ChatRenderer(tok)
    forced = kept_ids(tok, renderer, folder, vocab_size)
    if min(sizes) < len(forced):  # before counting, not after it
        raise TokenMapError(f"--sizes {min(sizes)} is smaller than the {len(forced)} special tokens every map keeps "
                            f"(EOS, the chat template's and the stop ids: {forced})")
    t1 = time.perf_counter()
    if args.from_counts:
        counts, meta, fitted = _from_counts(args, tok, vocab_size)
    else:
        (counts, meta), fitted = _count(args, tok, renderer, vocab_size), False
    t2 = time.perf_counter()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    maps = {n: freq_list(counts, n, forced) for n in sizes}
    map_meta = {"tokenizer": str(meta.get("tokenizer")), "vocab_hash": str(meta.get("vocab_hash")),
                "mode": str(meta.get("mode")), "total_tokens": str(meta.get("total_tokens")),
                "forced_ids": json.dumps(forced)}
    for n, ids in maps.items():
        save_freq(out / f"freq_{n}.pt", ids)
        d2t, t2d = vocab_map(ids, vocab_size)
        save_vocab_map(out / f"vocab_map_{n}.safetensors", d2t, t2d, {**map_meta, "size": str(n)})
    counts_path = out / "token_counts.safetensors"
    if not args.from_counts or fitted:  # resized counts are saved as the maps use them
        save_counts(counts_path, counts, meta)
    elif not counts_path.exists() or not counts_path.samefile(args.from_counts):
        with atomic_path(counts_path) as tmp:
            shutil.copyfile(args.from_counts, tmp)
    title = f"{meta.get('tokenizer')} - {int(meta['total_tokens']):,} tokens ({meta.get('mode')})"
    cov = write_coverage(out, counts, {**earlier_maps(out, counts, maps), **maps}, title)
    t3 = time.perf_counter()
    return {"out": str(out), "sizes": sizes, "coverage": cov, "forced_ids": forced,
            "seconds": {"tokenizer": t1 - t0, "count": t2 - t1, "write": t3 - t2, "total": t3 - t0}}


def main(args: argparse.Namespace) -> int:
    res = build(args)
    print(f"{'size':>8}  {'coverage':>9}  files")
    for n in res["sizes"]:
        print(f"{n:>8}  {res['coverage']['sizes'][str(n)] * 100:>8.2f}%  freq_{n}.pt  vocab_map_{n}.safetensors")
    print(f"wrote {res['out']}/ (token_counts.safetensors, coverage.json, coverage.png)")
    return 0
