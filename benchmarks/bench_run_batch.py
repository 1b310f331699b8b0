"""`toolkit run-batch` on SmolLM2 with the shipped EAGLE-3 head: MT-bench first turns as an OpenAI batch file
(greedy chat requests), answered with the head and with --no-speculation, at each --max-batch-size given.

Per run: seconds answering (the summary line's, model loading left out), generated tokens, tokens/s, τ, and
whether every answer's text equals the no-speculation run's at the same batch size and the batch-1 run's (greedy:
they must).

    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 MALLOC_TOP_PAD_=1073741824 \\
        python benchmarks/bench_run_batch.py [--shared ../shared] [--limit 20] [--max-tokens 128] \\
        [--batch-sizes 1,4,8] [--threads 1] [--compile] [--out results.json]
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HEAD = Path(__file__).resolve().parent / "heads" / "smollm2-135m-eagle3"


def batch_file(questions: list[dict], max_tokens: int, path: Path) -> None:
    rows = [{"custom_id": f"q{q['question_id']}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"messages": [{"role": "user", "content": q["turns"][0]}], "max_tokens": max_tokens,
                      "temperature": 0}} for q in questions]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def run(src: Path, out: Path, batch: int, threads: int, speculate: bool, compile: bool = False) -> dict:
    cmd = [sys.executable, "-m", "toolkit.cli", "run-batch", "-i", str(src), "-o", str(out), "--threads", str(threads),
           "--max-batch-size", str(batch), "--log-every", "0", "--max-seq-len", "1024", *(["--compile"] * compile),
           *(["--draft", str(HEAD)] if speculate else ["--model", "smollm2-135m-instruct", "--no-speculation"])]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    seconds = float(re.search(r" in ([0-9.]+) s:", done.stdout).group(1))
    answers = [json.loads(line) for line in out.read_text().splitlines()]
    usage = [a["response"]["body"]["usage"] for a in answers]
    steps = sum(u["speculative"]["verify_steps"] for u in usage)
    tokens = sum(u["completion_tokens"] for u in usage)
    return {"batch": batch, "speculation": speculate, "seconds": seconds, "tokens": tokens,
            "tokens_per_s": round(tokens / seconds, 2),
            "tau": round(1 + sum(u["speculative"]["accepted_tokens"] for u in usage) / steps, 3) if steps else None,
            "texts": [a["response"]["body"]["choices"][0]["message"]["content"] for a in answers]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shared", default=str(Path(__file__).resolve().parents[2] / "shared"))
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--batch-sizes", default="1,4,8")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--compile", action="store_true", help="the compiled CPU step (torch.compile) in every run")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    questions = [json.loads(s) for s in (Path(args.shared) / "data/eval/mt_bench.jsonl").read_text().splitlines()]
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "batch.jsonl"
        batch_file(questions[:args.limit], args.max_tokens, src)
        runs = []
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            for speculate in (True, False):
                r = run(src, Path(tmp) / "out.jsonl", batch, args.threads, speculate, args.compile)
                runs.append(r)
                print(f"batch {batch:2d} {'EAGLE-3' if speculate else 'plain  '}: {r['tokens']} tokens in "
                      f"{r['seconds']:.1f} s = {r['tokens_per_s']:.2f} tok/s, tau {r['tau']}", flush=True)
    base = runs[1]["texts"]  # batch 1 (the first size), no speculation
    for r in runs:
        r["same_texts_as_first_plain"] = r.pop("texts") == base
    pairs = {r["batch"]: r for r in runs if r["speculation"]}
    result = {"questions": args.limit, "max_tokens": args.max_tokens, "threads": args.threads,
              "compile": args.compile, "runs": runs,
              "speedup_by_batch": {b: round(s["tokens_per_s"] / next(r["tokens_per_s"] for r in runs
                                   if r["batch"] == b and not r["speculation"]), 3) for b, s in pairs.items()}}
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
