"""Batched prefill on CPU: the engine's grouped prefill (engine.prefill_groups: neighbours of similar length
padded together, logits only at each row's last token) against one right-padded forward over the whole batch
(what `Engine.admit` did before) and against one forward per prompt. SmolLM2, fp32, the first --rows
training prompts' first user turn, as `toolkit regenerate` prefills them (sorted by length).

    python benchmarks/train_mix.py --n 6000 --out train_mix.jsonl
    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 MALLOC_TOP_PAD_=1073741824 \\
        python benchmarks/bench_prefill.py --data train_mix.jsonl [--rows 48] [--threads 1] [--out prefill.json]
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from toolkit.data.tokenizer import load_tokenizer
from toolkit.infer.engine import Engine
from toolkit.infer.prefill_plan import pad, prefill_groups
from toolkit.infer.loading import load_target
from toolkit.infer.sampling import SamplingParams
from toolkit.infer.sequence import Sequence
from toolkit.models import resolve_target


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="chat JSONL ({'messages': [...]}), e.g. train_mix.py's output")
    ap.add_argument("--rows", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    folder = resolve_target()
    tok, target = load_tokenizer(model=str(folder)), load_target(folder)
    ids = []
    for line in open(args.data):
        first = next(m for m in json.loads(line)["messages"] if m["role"] == "user")
        text = tok.apply_chat_template([first], tokenize=False, add_generation_prompt=True)
        ids.append(tok(text, add_special_tokens=False).input_ids)
        if len(ids) == args.rows:
            break
    ids.sort(key=len)
    engine = Engine(target, max_len=1024, max_batch=len(ids))
    cache = engine.cache

    def grouped():
        seqs = [Sequence(p, SamplingParams(max_new_tokens=1)) for p in ids]
        engine.admit(seqs)  # max_new_tokens 1: every sequence is done at its first token and leaves

    with torch.no_grad():
        target(torch.tensor([ids[-1]]), cache=cache.rows(0, 1))  # warm-up: first-call allocations untimed
        report = {
            "rows": len(ids), "tokens": sum(map(len, ids)), "padded_tokens": len(ids) * max(map(len, ids)),
            "groups": len(prefill_groups([len(p) for p in ids])), "threads": args.threads,
            "one_padded_forward_s": timed(lambda: target(pad(ids, 0), cache=cache.rows(0, len(ids)))),
            "one_forward_per_prompt_s": timed(lambda: [target(torch.tensor([p]), cache=cache.rows(b, b + 1))
                                                       for b, p in enumerate(ids)]),
            "engine_grouped_s": timed(grouped),
        }
    report["speedup_vs_one_padded_forward"] = report["one_padded_forward_s"] / report["engine_grouped_s"]
    print(json.dumps(report, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
