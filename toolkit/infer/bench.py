"""`toolkit bench`: acceptance length and speed of a draft on a prompt set, against the same engine without
speculation and against transformers `generate`, all in one run.

    toolkit bench --draft ./ckpt --prompts mt_bench.jsonl --limit 10 --baseline --compare-hf --out bench.json

Multi-turn prompts (MT-bench `turns`) are answered turn by turn: turn 2 sees the model's own turn-1 answer.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch

from toolkit.atomic import check_out_path, write_text
from toolkit.cpu_speed import threads_problem
from toolkit.data.tokenizer import template_kwargs
from toolkit.embedded import DEFAULT_MODEL
from toolkit import hub
from toolkit.infer import loading, lookup
from toolkit.infer.bench_report import print_summary, write_png
from toolkit.infer.bench_sweep import parse_sweep, run_sweep
from toolkit.infer.prompts import answer_records, answer_turns, parse_shard, prompt_text, read_prompts, warm_up_ids
from toolkit.infer.tree import TreeConfig
from toolkit.seeds import seed_arg


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--draft", "--speculative-draft-model-path", required=True,
                   help="draft folder or hub id: EAGLE-3, EAGLE-1/2 (SafeAILab layout) or MTP (ours, or a target that "
                        "ships MTP layers); docs/formats.md")
    p.add_argument("--token-map", "--speculative-token-map", default=None,
                   help="FR-Spec freq_N.pt (or org/name/freq_N.pt on the hub) for an EAGLE-1/2 or MTP head (EAGLE-3 "
                        "heads carry their vocabulary)")
    p.add_argument("--model", "--model-path", default=None, help="target (default: the one the draft records, else "
                                                 f"{DEFAULT_MODEL})")
    p.add_argument("--prompts", required=True, help="JSONL/JSON prompts: MT-bench turns or any corpus schema")
    p.add_argument("--limit", type=int, default=None, help="first N prompts only (of the shard, with --shard)")
    p.add_argument("--shard", default=None, metavar="I/N", help="prompts I, I+N, I+2N, ... (0-based) only: split a "
                   "long set across processes or sessions; on a category-sorted file like MT-bench each shard takes "
                   "every category. Join the shards' JSONs with benchmarks/merge_bench.py")
    p.add_argument("--max-new-tokens", type=int, default=256, help="per turn")
    p.add_argument("--chat-template-kwargs", default=None, metavar="JSON",
                   help='extra template variables every turn is asked with (every run alike), e.g. '
                        '\'{"enable_thinking": false}\' (Qwen3), as vLLM / SGLang take them')
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1 = off)")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k likeliest tokens (0 = off)")
    p.add_argument("--seed", type=seed_arg, default=0, help="sampling seed")
    p.add_argument("--num-steps", "--speculative-num-steps", type=int, default=5, help="draft depth per round")
    p.add_argument("--topk", "--speculative-eagle-topk", type=int, default=1, help="candidates per node (1 = chain)")
    p.add_argument("--num-draft-tokens", "--speculative-num-draft-tokens", type=int, default=None,
                   help="tokens verified per round, root included (default: num_steps + 1)")
    p.add_argument("--baseline", action="store_true", help="also run the engine without speculation")
    p.add_argument("--compare-hf", action="store_true", help="also run transformers generate")
    p.add_argument("--compare-pld", type=int, default=0, metavar="N",
                   help="also run transformers prompt-lookup decoding with N lookup tokens (the peer that needs no "
                        "training)")
    p.add_argument("--sweep", default=None, metavar="S,K,N;S,K,N,L",
                   help="more runs over the same prompts: num_steps,topk,num_draft_tokens entries separated by ';'; "
                        "a fourth number is that entry's lookup branch length (0 = none; default: --lookup)")
    p.add_argument("--compare-endpoint", default=None, metavar="URL",
                   help="also answer the prompts on a running SGLang or vLLM server (or toolkit serve) serving this "
                        "target and head: its τ, acceptance by position and tok/s beside the engine's, greedy texts "
                        "checked identical (infer/bench_endpoint.py)")
    p.add_argument("--endpoint-kind", default="auto", choices=["auto", "sglang", "vllm"],
                   help="how --compare-endpoint reports acceptance: SGLang's /generate meta_info or vLLM's /metrics "
                        "(auto: by what the server answers)")
    lookup.add_args(p, "; the baseline stays plain decoding")
    p.add_argument("--sample-draft", action="store_true", help="T > 0, chains (topk 1): draw the draft tokens from "
                   "the head's tempered distribution and verify with speculative sampling (min(1, p/q)) instead of "
                   "proposing its top-1 (EAGLE/SGLang); trees in --sweep keep top-k proposals")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--max-len", type=int, default=4096, help="KV cache length per sequence")
    p.add_argument("--prefix-cache-rows", type=int, default=0, metavar="N", help="keep N finished turns' KV so a "
                   "second turn prefills only what is new, as `toolkit serve` does (default 0: every turn in full)")
    loading.add_args(p)
    p.add_argument("--out", default="bench.json", help="results JSON; a PNG is written beside it")
    p.add_argument("--answers", default=None, metavar="FILE.jsonl", help="also write the speculative run's "
                   "answers as FastChat llm_judge model answers (question_id, model_id, choices[0].turns), with "
                   "each turn's tau")
    p.add_argument("--model-id", default=None, help="model_id in --answers (default: --draft as given)")


def differing(a: list, b: list, dtype: torch.dtype) -> int:
    """How many prompts' answers differ. fp32 steps are bit-exact, so any is a bug; in bf16 / fp16 the verify
    step rounds otherwise than a decode step, and an argmax within a rounding step of a tie may go either way
    from there on (SGLang and vLLM alike), so some differ in long answers with no loss of correctness."""
    n = sum(x != y for x, y in zip(a, b))
    if n and dtype != torch.float32:
        print(f"{n} of {len(a)} greedy answers differ: in {str(dtype).removeprefix('torch.')} a verify step rounds "
              "otherwise than a decode step, and near-tied argmaxes flip (bit-identical in float32)", file=sys.stderr)
    return n


def run_engine(engine, tok, prompts, params, seed, stops: set[int]) -> tuple[list, list[list[str]], float]:
    """Our engine on every prompt (after a short warm-up); returns results, answers per prompt, wall seconds."""
    from toolkit.infer.sampling import SamplingParams, seeded_generator

    engine.warm_up()  # --compile: every step shape compiled here, not inside the timed run
    warm = warm_up_ids(tok, prompts)
    if len(warm) + params.max_new_tokens <= engine.max_len:  # else the run below says what does not fit
        engine.generate(warm, SamplingParams(max_new_tokens=4))
    if engine.prefix_cache is not None:  # else the first timed prompt would find the warm-up's KV kept
        engine.prefix_cache.clear()
    results, start = [], time.perf_counter()
    g = seeded_generator(engine.device, seed)  # on the target's device: CUDA sampling refuses a CPU generator

    def generate(ids, p):
        res = engine.generate(ids, params, stops, g)
        res.category, res.turn = str(p["category"]), p["turn"]
        results.append(res)
        return res.tokens

    answers = answer_turns(tok, prompts, generate)
    return results, answers, time.perf_counter() - start


def main(args: argparse.Namespace) -> int:
    from toolkit.infer.engine import Engine
    from toolkit.infer.hf_reference import run_hf
    from toolkit.infer.loading import load, probe, stop_ids
    from toolkit.infer.metrics import summarize
    from toolkit.infer.sampling import SamplingParams

    if problem := threads_problem(args.threads):
        raise ValueError(problem)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit {args.limit}: give at least 1 prompt")
    if Path(args.out).suffix.lower() == ".png":
        raise ValueError(f"--out {args.out}: give the JSON's name; the PNG is written beside it with .png")
    check_out_path("--out", args.out, folder=False)
    if Path(args.out).with_suffix(".png").is_dir():  # else the JSON was written and the PNG beside it failed
        raise ValueError(f"--out {args.out}: the PNG written beside it, {Path(args.out).with_suffix('.png')}, is a "
                         "folder; give another name")
    if args.out.endswith(("/", os.sep)):  # a folder yet to be made (an existing one: check_out_path)
        raise ValueError(f"--out {args.out} is a folder; give the results JSON's file name, e.g. "
                         f"{Path(args.out) / 'bench.json'}")
    if args.answers is not None:
        check_out_path("--answers", args.answers, folder=False)
        if Path(args.answers).resolve() == Path(args.out).resolve():
            raise ValueError(f"--answers {args.answers} is --out too; give the answers their own file")
        if Path(args.answers).resolve() == Path(args.out).with_suffix(".png").resolve():
            raise ValueError(f"--answers {args.answers} is the PNG written beside --out {args.out}; give the answers "
                             "their own file")
    if args.max_len < 2:
        raise ValueError(f"--max-len {args.max_len}: give the KV cache length per sequence, at least 2 tokens")
    if args.prefix_cache_rows < 0:
        raise ValueError(f"--prefix-cache-rows {args.prefix_cache_rows}: give 0 (none) or more rows")
    if args.compare_endpoint is not None and not args.compare_endpoint.startswith(("http://", "https://")):
        raise ValueError(f"--compare-endpoint {args.compare_endpoint}: give the server's URL, http://HOST:PORT")
    if args.compare_pld < 0:
        raise ValueError(f"--compare-pld {args.compare_pld}: give the lookup tokens per step (>= 1), or 0 for none")
    variables = template_kwargs(args.chat_template_kwargs)
    tree = TreeConfig(args.num_steps, args.topk,
                      args.num_steps + 1 if args.num_draft_tokens is None else args.num_draft_tokens)
    params = SamplingParams(args.temperature, args.top_p, args.top_k, args.max_new_tokens)
    branch = lookup.from_args(args)
    sweep = parse_sweep(args.sweep, branch, args.lookup_max_ngram or 3, args.lookup_min_ngram) if args.sweep is not None else []
    for cfg, own in sweep:
        if own is not None and args.sample_draft and cfg.topk == 1:
            raise ValueError(f"--sweep entry {cfg.num_steps},1,{cfg.num_draft_tokens},{own.num_tokens}: "
                             "--sample-draft and a lookup branch do not mix on a chain; give it lookup 0 or drop "
                             "--sample-draft")
    if args.sample_draft and params.greedy:
        raise ValueError("--sample-draft draws a chain's draft tokens at the request's temperature; with --temperature "
                         "0 every run is greedy and it would do nothing: drop it or give --temperature > 0")
    if args.sample_draft and tree.topk != 1 and all(cfg.topk != 1 for cfg, _ in sweep):
        raise ValueError(f"--sample-draft applies to chains (--topk 1), and no run here is one (--topk {args.topk}"
                         f"{', and every --sweep entry has topk > 1' if sweep else ''}): drop it or add a chain")
    prompts = read_prompts(args.prompts, args.limit, parse_shard(args.shard), variables)  # before minutes of loading
    draft = hub.draft_folder(args.draft)  # a hub id: fetched (or found in the HF cache) now
    loaded = load(draft, args.model, hub.file(args.token_map, "--token-map"), args.device, args.dtype, args.kernels,
                  args.fp32_lm_head)
    folder, tok, target, head = loaded.folder, loaded.tok, loaded.target, loaded.head
    stops = stop_ids(tok, folder)  # the same end-of-turn set for our engine and transformers' generate
    device, dtype = target.embed_tokens.weight.device, target.embed_tokens.weight.dtype
    max_len = min(args.max_len, target.config.max_position_embeddings)

    def make(draft, cfg, own=branch):  # CUDA graphs on a GPU unless --eager
        return Engine(target, draft, cfg, max_len, cuda_graphs=False if args.eager else None,
                      compile=args.compile, sample_draft=sampled(draft, cfg), lookup=own if draft else None,
                      prefix_cache_rows=args.prefix_cache_rows)

    def depth(cfg, own=branch) -> int:  # the deepest path a round can accept: the head's tree or the branch
        return max(cfg.num_steps, own.num_tokens if own is not None else 0)

    def sampled(draft, cfg) -> bool:  # --sample-draft applies to chains
        return args.sample_draft and draft is not None and cfg.topk == 1

    agree = probe(head, target, tok, prompt_text(tok, prompts[0]))  # the first prompt as it is benched

    results, spec_answers, wall = run_engine(make(head, tree), tok, prompts, params, args.seed, stops)
    report = {"draft": args.draft, "head": type(head).__name__, "token_map": args.token_map,
              "draft_vocab_size": len(head.d2t), "target": str(folder), "tree": vars(tree), "sampling": vars(params),
              "probe_agreement": agree, "shard": args.shard, "dtype": str(dtype).removeprefix("torch."),
              "fp32_lm_head": target.logits_fp32, "sample_draft": sampled(head, tree),
              "prompts_sha256": hashlib.sha256(Path(args.prompts).read_bytes()).hexdigest(), "limit": args.limit,
              "seed": args.seed, "chat_template_kwargs": variables,
              "lookup": None if branch is None else vars(branch),
              "prompts": len(prompts), "speculative": summarize(results, wall, depth(tree)),
              "per_category": {}, "per_turn": {}}
    # counts beside each τ, so that shards of one set merge exactly (benchmarks/merge_bench.py)
    for cat in sorted({r.category for r in results}):
        c = summarize([r for r in results if r.category == cat])
        report["per_category"][cat] = {k: c[k] for k in ("tau", "verify_steps", "tokens")}
    for turn in sorted({r.turn for r in results}):  # MT-bench's turn 2 often rewrites turn 1: copyable text
        t = summarize([r for r in results if r.turn == turn])
        report["per_turn"][str(turn)] = {k: t[k] for k in ("tau", "verify_steps", "tokens")}
    spec_tps = report["speculative"]["tokens_per_second"]
    if args.baseline:
        base, base_answers, base_wall = run_engine(make(None, None), tok, prompts, params, args.seed, stops)
        report["baseline"] = summarize(base, base_wall)
        report["speedup_vs_baseline"] = spec_tps / report["baseline"]["tokens_per_second"]
        if params.greedy:
            report["greedy_identical_to_baseline"] = base_answers == spec_answers
            report["greedy_answers_differing_from_baseline"] = differing(base_answers, spec_answers, dtype)
    if args.compare_hf:
        hf_answers, report["hf_generate"] = run_hf(folder, tok, prompts, params, args.seed, device, dtype,
                                                   stops=stops)
        report["speedup_vs_hf"] = spec_tps / report["hf_generate"]["tokens_per_second"]
        if params.greedy:
            report["greedy_identical_to_hf"] = hf_answers == spec_answers
            report["greedy_answers_differing_from_hf"] = differing(hf_answers, spec_answers, dtype)
    if args.compare_pld:
        pld_answers, report["prompt_lookup"] = run_hf(folder, tok, prompts, params, args.seed, device, dtype,
                                                      args.compare_pld, stops=stops)
        if "hf_generate" in report:
            report["prompt_lookup"]["speedup_vs_hf"] = (report["prompt_lookup"]["tokens_per_second"]
                                                        / report["hf_generate"]["tokens_per_second"])
        if params.greedy:
            report["greedy_identical_to_prompt_lookup"] = pld_answers == spec_answers
    if args.compare_endpoint:
        from toolkit.infer.bench_endpoint import compare_endpoint

        compare_endpoint(report, args, tok, prompts, params, stops, spec_answers, dtype, depth(tree), differing)
    if sweep:
        run_sweep(report, sweep, lambda cfg, own: run_engine(make(head, cfg, own), tok, prompts, params, args.seed,
                                                             stops), depth, lambda cfg: sampled(head, cfg),
                  params.greedy, spec_answers)
    if args.answers is not None:  # the speculative run's: greedy, every other run's text equals it (checked above)
        model_id = args.model_id or args.draft.rstrip("/\\") or args.draft
        records = answer_records(prompts, spec_answers, results, model_id)
        write_text(args.answers, "".join(json.dumps(r) + "\n" for r in records))
    out = Path(args.out)
    write_png(out.with_suffix(".png"), report["speculative"])  # first: the JSON, written last, says the run is whole
    write_text(out, json.dumps(report, indent=2) + "\n")
    print_summary(report, branch is not None)
    print(f"wrote {out} and {out.with_suffix('.png')}" + (f", answers in {args.answers}" if args.answers else ""))
    return 0
