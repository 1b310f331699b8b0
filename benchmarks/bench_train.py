"""Training throughput of the EAGLE-3 trainer, online (target in-process) and offline (hidden-state shards),
with peak memory and the time to dump the shards, each run as its own `toolkit` process.

    python benchmarks/bench_train.py --data out/prepared --rows 200 --steps 20 --threads 2 \
        --out benchmarks/train_throughput.json [recipe overrides: key=value ...]

Uses the first --rows rows of a prepared dataset (copied into a work folder), the recipe
recipes/smollm2-135m-eagle3.yaml unless --config says otherwise, and reports the mean tokens/s over the logged
steps after the first (warm-up) one.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def toolkit(*args: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "toolkit.cli", *args], check=True, cwd=ROOT)
    return time.perf_counter() - start


def summary(run: Path) -> dict:
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in recs if "tokens_per_second" in r]
    timed = steps[1:] or steps
    return {"tokens_per_second": sum(r["tokens_per_second"] for r in timed) / len(timed),
            "peak_memory_gb": max(r["peak_memory_gb"] for r in steps), "steps": len(steps),
            "final_loss": steps[-1]["loss"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="prepared dataset (toolkit prepare-data)")
    p.add_argument("--config", default=str(ROOT / "recipes/smollm2-135m-eagle3.yaml"))
    p.add_argument("--rows", type=int, default=200)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="train_throughput.json")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    args = p.parse_args()
    import datasets

    with tempfile.TemporaryDirectory(prefix="bench-train-") as work:
        work = Path(work)
        ds = datasets.load_from_disk(args.data)
        ds.select(range(min(args.rows, len(ds)))).save_to_disk(str(work / "data"))
        shutil.copy(Path(args.data) / "toolkit_prepare.json", work / "data" / "toolkit_prepare.json")
        meta = json.loads((work / "data" / "toolkit_prepare.json").read_text())
        common = ["--config", args.config, "--data", str(work / "data"), f"max_steps={args.steps}",
                  f"threads={args.threads}", "log_every=1", f"save_every={args.steps}", "eval_samples=1",
                  "eval_max_new_tokens=1", *args.overrides]
        toolkit("train", *common, "--output-dir", str(work / "online"))
        dump_s = toolkit("dump-hidden-states", "--data", str(work / "data"), "--out", str(work / "hidden"),
                         "--model", meta.get("target") or "smollm2-135m-instruct", "--threads", str(args.threads))
        toolkit("train", *common, "--output-dir", str(work / "offline"), "--hidden-states", str(work / "hidden"))
        tokens = json.loads((work / "hidden" / "index.json").read_text())["num_tokens"]
        report = {"data": args.data, "rows": args.rows, "steps": args.steps, "threads": args.threads,
                  "config": args.config, "overrides": args.overrides,
                  "online": summary(work / "online"), "offline": summary(work / "offline"),
                  "dump_hidden_states": {"seconds": dump_s, "tokens": tokens}}
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
