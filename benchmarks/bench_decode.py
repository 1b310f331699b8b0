"""Plain decoding speed on CPU: our engine (no draft) against transformers `generate`, same prompts,
greedy, identical tokens checked. Also the cost of one speculative round (draft tree + verify) against a
plain decode step, with a random EAGLE-3 head (speed does not depend on trained weights).

    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 MALLOC_TOP_PAD_=1073741824 \\
        python benchmarks/bench_decode.py [--shared ../shared] [--questions 10] [--max-new-tokens 64] [--threads 1] \\
            [--compile]

--compile also times our engine with its torch.compile'd CPU step (compiled_decode.py; compile time reported
apart, not counted in tokens/s) and a chain-of-5 verify round (6 tokens) with and without it.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from toolkit.data.tokenizer import load_tokenizer
from toolkit.infer.drafts import random_head
from toolkit.infer.engine import Engine
from toolkit.infer.loading import load_target
from toolkit.infer.sampling import SamplingParams
from toolkit.infer.tree import TreeConfig
from toolkit.models import resolve_target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", default=str(Path(__file__).resolve().parents[2] / "shared"))
    ap.add_argument("--questions", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--compile", action="store_true", help="also the engine's compiled CPU step")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    folder = resolve_target()
    tok = load_tokenizer(model=str(folder))
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ours = load_target(folder)
    rows = [json.loads(line) for line in open(Path(args.shared) / "data/eval/mt_bench.jsonl")][: args.questions]
    prompts = [tok.apply_chat_template([{"role": "user", "content": r["turns"][0]}], tokenize=False,
                                       add_generation_prompt=True) for r in rows]
    ids = [tok(p, add_special_tokens=False).input_ids for p in prompts]
    n = args.max_new_tokens
    params = SamplingParams(max_new_tokens=n)
    engine = Engine(ours, max_len=2048)
    compiled, compile_s = None, 0.0
    if args.compile:
        compiled = Engine(ours, max_len=2048, compile=True)
        t = time.perf_counter()
        compiled.generate(ids[0], SamplingParams(max_new_tokens=2))  # compiles the step (two graph shapes)
        compile_s = time.perf_counter() - t
    t_hf = t_ours = t_comp = 0.0
    same = same_comp = True
    for x in ids:
        t = time.perf_counter()
        ref = hf.generate(torch.tensor([x]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                          pad_token_id=tok.eos_token_id)[0, len(x):].tolist()
        t_hf += time.perf_counter() - t
        t = time.perf_counter()
        got = engine.generate(x, params).tokens
        t_ours += time.perf_counter() - t
        same &= got == ref
        if compiled is not None:
            t = time.perf_counter()
            got = compiled.generate(x, params).tokens
            t_comp += time.perf_counter() - t
            same_comp &= got == ref
    steps = []
    spec = Engine(ours, random_head(ours.config, seed=0), TreeConfig(6, 10, 60), max_len=2048)
    for x in ids[:3]:
        res = spec.generate(x, SamplingParams(max_new_tokens=16))
        steps.append((res.seconds["draft"] + res.seconds["verify"]) / res.verify_steps)
    res_plain = engine.generate(ids[0], SamplingParams(max_new_tokens=16))
    plain_step = res_plain.seconds["verify"] / res_plain.verify_steps
    total = n * len(ids)
    out = {"threads": args.threads, "questions": len(ids), "new_tokens_each": n,
           "hf_tok_s": round(total / t_hf, 1), "ours_tok_s": round(total / t_ours, 1),
           "ours_vs_hf": round(t_hf / t_ours, 2), "identical_greedy_tokens": same,
           "plain_step_ms": round(plain_step * 1e3, 1),
           "tree60_round_ms (draft 6x10 + verify 60)": round(statistics.median(steps) * 1e3, 1),
           "round_vs_plain_step": round(statistics.median(steps) / plain_step, 2)}
    if compiled is not None:
        chain = {}
        for comp in (False, True):  # one verify round of a chain of 5 (6 tokens) against one decode step
            eng = Engine(ours, random_head(ours.config, seed=0), TreeConfig(5, 1, 6), max_len=2048, compile=comp)
            eng.generate(ids[0], SamplingParams(max_new_tokens=8))  # compiles (comp) and warms up
            r = [eng.generate(x, SamplingParams(max_new_tokens=16)) for x in ids[:3]]
            chain[comp] = sum(x.seconds["verify"] for x in r) / sum(x.verify_steps for x in r)
        res_comp = compiled.generate(ids[0], SamplingParams(max_new_tokens=16))
        comp_step = res_comp.seconds["verify"] / res_comp.verify_steps
        out.update({"compiled_tok_s": round(total / t_comp, 1), "compiled_vs_hf": round(t_hf / t_comp, 2),
                    "compiled_identical_greedy_tokens": same_comp, "compile_s": round(compile_s, 1),
                    "compiled_plain_step_ms": round(comp_step * 1e3, 1),
                    "chain5_verify_ms eager / compiled": [round(chain[False] * 1e3, 1), round(chain[True] * 1e3, 1)],
                    "chain5_verify_vs_plain_step eager / compiled": [round(chain[False] / plain_step, 2),
                                                                      round(chain[True] / comp_step, 2)]})
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
