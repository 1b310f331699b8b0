"""What `logprobs` and the penalties cost a speculative step: SmolLM2 with the shipped EAGLE-3 head, the first
turns of MT-bench, greedy, a chain of 5 and a tree (4, 4, 16), with the request options a server passes through:
none, `logprobs` 5, `repetition_penalty` 1.1 + `frequency_penalty` 0.2, both. Per setting: tokens/s, τ, and
whether the speculative text equals the engine's plain decoding under the same options (it must).

    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 MALLOC_TOP_PAD_=1073741824 \\
        python benchmarks/bench_sampling_extras.py [--shared ../shared] [--questions 10] [--max-new-tokens 128] \\
            [--threads 1] [--out results.json]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from toolkit.infer.engine import Engine
from toolkit.infer.loading import load
from toolkit.infer.loading import stop_ids as end_ids
from toolkit.infer.prompts import prompt_text, read_prompts
from toolkit.infer.sampling import SamplingParams
from toolkit.infer.tree import TreeConfig

HEAD = Path(__file__).resolve().parent / "heads" / "smollm2-135m-eagle3"
OPTIONS = {"none": {}, "logprobs 5": {"logprobs": 5},
           "penalties": {"repetition_penalty": 1.1, "frequency_penalty": 0.2},
           "logprobs 5 + penalties": {"logprobs": 5, "repetition_penalty": 1.1, "frequency_penalty": 0.2}}
TREES = {"chain 5": TreeConfig(5, 1, 6), "tree (4, 4, 16)": TreeConfig(4, 4, 16)}


def run(engine: Engine, prompts: list[list[int]], params: SamplingParams, stops) -> tuple[list, float]:
    t0 = time.perf_counter()
    results = [engine.generate(p, params, stops) for p in prompts]
    return results, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", default=str(Path(__file__).resolve().parents[2] / "shared"))
    ap.add_argument("--questions", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load(str(HEAD), None, None, "cpu", "float32")
    tok, stops = loaded.tok, frozenset(end_ids(loaded.tok, loaded.folder))
    prompts = [tok(prompt_text(tok, p), add_special_tokens=False).input_ids
               for p in read_prompts(str(Path(args.shared) / "data" / "eval" / "mt_bench.jsonl"), args.questions)]
    plain = Engine(loaded.target, max_len=1024)
    rows = []
    for opt, extra in OPTIONS.items():
        params = SamplingParams(max_new_tokens=args.max_new_tokens, **extra)
        plain.generate(prompts[0], SamplingParams(max_new_tokens=4, **extra), stops)  # warm-up
        base, base_s = run(plain, prompts, params, stops)
        tokens = sum(len(r.tokens) for r in base)
        rows.append({"options": opt, "draft": "none", "tokens": tokens, "tok_s": tokens / base_s, "tau": 1.0})
        for name, tree in TREES.items():
            engine = Engine(loaded.target, loaded.head, tree, max_len=1024)
            engine.generate(prompts[0], SamplingParams(max_new_tokens=4, **extra), stops)
            spec, secs = run(engine, prompts, params, stops)
            steps = sum(r.verify_steps for r in spec)
            rows.append({"options": opt, "draft": name, "tokens": sum(len(r.tokens) for r in spec),
                         "tok_s": sum(len(r.tokens) for r in spec) / secs,
                         "tau": sum(len(r.tokens) - 1 for r in spec) / max(steps, 1),
                         "same_text_as_plain": [r.tokens for r in spec] == [r.tokens for r in base]})
        for r in rows[-3:]:
            print(json.dumps(r), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"questions": args.questions, "max_new_tokens": args.max_new_tokens,
                                              "threads": args.threads, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
