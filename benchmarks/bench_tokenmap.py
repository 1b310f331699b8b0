"""Token-map build speed against its limit and against a per-line loop, in one run.

    python benchmarks/bench_tokenmap.py [--shared ../shared] [--repeats 3]

Corpus: every file of ../shared/data/train, rendered with the Llama-3 chat template, tokenizer
../shared/tokenizers/llama3/tokenizer.json (128,256 ids). Three figures (median of --repeats):
  1. bare:  encode_batch_fast over the already-rendered texts held in memory, batches of 2048, ids taken
            out (the limit: no reading, no rendering, no counting, no writing);
  2. ours:  `toolkit build-token-map` end to end in this process (read, render, tokenize, count, write three
            maps + counts + coverage.json/png), less its tokenizer load, which the others do not pay either;
  3. loop:  FR-Spec's way: per text `tokenizer.encode(text)` + collections.Counter.update.
Goals: bare/ours >= 0.85 and loop/ours >= 5. Figures are medians of --repeats runs (loop: of repeats // 3).
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

from toolkit.cli import build_parser
from toolkit.data.chat import ChatRenderer
from toolkit.data.tokenizer import load_tokenizer
from toolkit.data.schemas import read_samples
from toolkit.tokenmap.build import build


def timed(fn, repeats):
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def self_timed(fn, repeats):  # fn returns (seconds, result)
    runs = [fn() for _ in range(repeats)]
    return statistics.median(r[0] for r in runs), runs[0][1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", default=str(Path(__file__).resolve().parents[2] / "shared"))
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    shared = Path(args.shared)
    tok_path = shared / "tokenizers/llama3/tokenizer.json"
    files = sorted(str(p) for p in (shared / "data/train").iterdir())

    t = time.perf_counter()
    tok = load_tokenizer(tokenizer=str(tok_path))
    load_s = time.perf_counter() - t
    renderer = ChatRenderer(tok)
    texts = [s if isinstance(s, str) else renderer.render(s) for f in files for s in read_samples(f)]
    backend = tok.backend_tokenizer

    def bare():
        n = 0
        for i in range(0, len(texts), 2048):
            n += sum(len(e.ids) for e in backend.encode_batch_fast(texts[i:i + 2048], add_special_tokens=False))
        return n

    phases = []

    def ours():  # everything `toolkit build-token-map` does after loading its tokenizer
        with tempfile.TemporaryDirectory() as out:
            cli = build_parser().parse_args(["build-token-map", "--tokenizer", str(tok_path), "--data", *files,
                                             "--sizes", "8192,16384,32768", "--out", out, "--quiet"])
            res = build(cli)
            phases.append({k: round(v, 2) for k, v in res["seconds"].items()})
            return res["seconds"]["count"] + res["seconds"]["write"], res["coverage"]["total_tokens"]

    def loop():
        c = Counter()
        for text in texts:
            c.update(tok.encode(text, add_special_tokens=False))
        return sum(c.values())

    bare_s, n_bare = timed(bare, args.repeats)
    ours_s, n_ours = self_timed(ours, args.repeats)
    loop_s, n_loop = timed(loop, max(1, args.repeats // 3))
    assert n_bare == n_ours == n_loop, (n_bare, n_ours, n_loop)
    res = {"machine": f"{platform.machine()} {__import__('os').cpu_count()} cores", "texts": len(texts),
           "tokens": n_bare, "tokenizer_load_s": round(load_s, 2), "bare_s": round(bare_s, 2),
           "ours_s": round(ours_s, 2), "loop_s": round(loop_s, 2),
           "ours_vs_bare": round(bare_s / ours_s, 3), "ours_vs_loop": round(loop_s / ours_s, 2),
           "ours_phases": phases}
    print(json.dumps(res, indent=2))
    print(f"| {len(texts):,} texts, {n_bare:,} tokens | bare {bare_s:.2f} s ({n_bare / bare_s:,.0f} tok/s) | "
          f"ours {ours_s:.2f} s ({n_bare / ours_s:,.0f} tok/s) | loop {loop_s:.2f} s ({n_bare / loop_s:,.0f} "
          f"tok/s) | ours/bare speed {bare_s / ours_s:.2f} | ours/loop speed {loop_s / ours_s:.1f}x |")


if __name__ == "__main__":
    main()
