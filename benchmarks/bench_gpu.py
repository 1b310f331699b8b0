"""Engine step costs on a GPU with random weights of a real shape (speed does not depend on trained weights).

    python benchmarks/bench_gpu.py                       # Llama-3.1-8B shape, bf16, CUDA, 1k context
    python benchmarks/bench_gpu.py --config tiny --device cpu --dtype float32 --iters 3   # CPU smoke run
    add --cuda-graphs to time the engine's graphed steps (toolkit/infer/graphs.py; on CPU: eager replays)
    add --engine N to also run the whole Engine (N new tokens after a --context prompt): plain decoding, a
    chain of 5 and a 6 x 10 -> 60 tree with the random head (tau ~ 1), so a round's full cost is measured

Figures (batch 1, KV cache filled to --context): plain decode step and tok/s against the roofline (weight
bytes / measured device copy bandwidth; goal >= 90%), target verify step for 2..64 tree tokens against the
decode step (goal: 8 tokens <= 1.10x), EAGLE-3 draft step against the target step (goal <= 5%), the whole
draft loop of a 60-token tree (6 steps x topk 10), and the
batch-1 speedup they predict for a chain at tau = 2, 3, 4: tau * t_decode / (t_verify(k+1) + k * t_draft).

The draft step is timed two ways. draft_step_ms: one head forward replayed alone, its graph's input copies and
output clones included (~8 small kernels around a ~14-kernel step). draft_step_in_chain_ms: what one more
step costs inside the engine's own greedy chain loop (GraphedDraftLoop: head forward, then argmax, d2t map
and embedding, one kernel under --kernels triton; no copies between steps), as (t(chain of 8) - t(chain of 2)) / 6 so that the loop's fixed costs cancel. The
second is the t_draft of the prediction and the figure the 5% goal is judged on.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch

from toolkit.infer.config import ModelConfig
from toolkit.infer.drafts import random_head
from toolkit.infer.graphs import GraphedDraftLoop, eager_capture, graph_draft, graph_target
from toolkit.infer.kv_cache import KVCache
from toolkit.infer.model import Transformer
from toolkit.infer.prepare import fuse_projections
from toolkit.infer.tree import TreeConfig, draft_trees

CONFIGS = {
    "llama3.1-8b": ModelConfig(model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                               num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5,
                               rope_theta=500000.0, max_position_embeddings=131072,
                               rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    "tiny": ModelConfig(model_type="llama", vocab_size=512, hidden_size=128, intermediate_size=256, num_layers=4,
                        num_heads=4, num_kv_heads=2, head_dim=32, max_position_embeddings=4096),
}


def timed(fn, iters: int, device: str) -> float:
    fn()  # warm-up
    if device == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / iters


def count_kernels(fn) -> int | None:
    """Device kernels one eager call launches (torch.profiler; None off CUDA)."""
    if not torch.cuda.is_available():
        return None
    fn()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def random_models(c: ModelConfig, dev: str, dtype, kernels: str):
    """A random target of config c and a random EAGLE-3 head over a 32k draft vocabulary, prepared as the engine
    loads them (fused q/k/v and gate/up) with `kernels` set (seed 0)."""
    torch.manual_seed(0)
    with torch.device(dev):
        model = Transformer(c).to(dtype).eval().fuse()  # fused q/k/v and gate/up, as load_target does
        head = random_head(c, list(range(min(32000, c.vocab_size)))).to(dtype)  # a 32k draft vocab
    fuse_projections(head)  # as draft_folder.load_draft does
    model.set_kernels(kernels)
    head.set_kernels(kernels)
    return model, head


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", choices=sorted(CONFIGS), default="llama3.1-8b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--cache-slots", type=int, default=0, metavar="S",
                    help="KV cache slots per sequence (default: the context + 80). An engine sizes its cache for its "
                    "longest request, and its graphs attend over all of it (graphs.py): e.g. 32768")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--kernels", choices=["torch", "triton"], default="torch",
                    help="triton: fused attention / norm / RoPE + cache write / SiLU-mul kernels (model.set_kernels)")
    ap.add_argument("--cuda-graphs", action="store_true", help="replay the steps from CUDA graphs, as the engine "
                    "does on a GPU (the forward then attends over the whole cache)")
    ap.add_argument("--engine", type=int, default=0, metavar="N",
                    help="also time the Engine end to end for N new tokens (0: skip)")
    ap.add_argument("--pdl", choices=["auto", "on", "off"], default=None,
                    help="programmatic dependent launch for --kernels triton (sets TOOLKIT_PDL; kernels/pdl.py)")
    ap.add_argument("--epilogues", choices=["auto", "on", "off"], default=None,
                    help="RoPE + cache write and SiLU-mul as GEMV epilogues for --kernels triton (sets "
                    "TOOLKIT_EPILOGUES; kernels/epilogues.py)")
    ap.add_argument("--profile", action="store_true", help="print the GPU kernel time of one eager decode step by "
                    "kernel, and the host (Python) time of the engine's chain rounds by function")
    args = ap.parse_args()
    if args.pdl:  # read at every launch, so set before anything is captured
        os.environ["TOOLKIT_PDL"] = args.pdl
    if args.epilogues:
        os.environ["TOOLKIT_EPILOGUES"] = args.epilogues
    dev, dtype, c = args.device, getattr(torch, args.dtype), CONFIGS[args.config]
    model, head = random_models(c, dev, dtype, args.kernels)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    buf = torch.empty(max(weight_bytes // 8, 1 << 20), dtype=torch.uint8, device=dev)
    copy_s = timed(lambda: buf.clone(), args.iters, dev)
    bandwidth = 2 * buf.numel() / copy_s  # read + write
    ctx = args.context
    slots = args.cache_slots or ctx + 80
    if slots < ctx + 80:
        ap.error(f"--cache-slots {slots}: the steps need the context + 80 = {ctx + 80}")
    cache = KVCache(c, 1, slots, dtype, dev)
    cache.k.normal_()
    cache.v.normal_()
    capture = None if dev == "cuda" else eager_capture

    def step(n: int):
        tokens = torch.randint(0, c.vocab_size, (1, n), device=dev)
        positions = torch.arange(ctx, ctx + n, device=dev)[None]
        mask = torch.ones(1, n, ctx + n, dtype=torch.bool, device=dev).tril(diagonal=ctx)
        if args.cuda_graphs:
            graphed = graph_target(model, cache, [], [1], [n], capture)
            return lambda: graphed(tokens=tokens, positions=positions, slots=positions, mask=mask)
        return lambda: model(tokens, positions, cache=cache, mask=mask)

    with torch.no_grad():
        kernels_per_step = count_kernels(lambda: model(torch.zeros(1, 1, dtype=torch.long, device=dev),
                                                       torch.tensor([[ctx]], device=dev), cache=cache,
                                                       mask=torch.ones(1, 1, ctx + 1, dtype=torch.bool, device=dev)))
        if args.profile and dev == "cuda":
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                step(1)()
                torch.cuda.synchronize()
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14), flush=True)
        decode = timed(step(1), args.iters, dev)
        verify = {n: timed(step(n), args.iters, dev) for n in (2, 4, 8, 16, 32, 64)}
        dcache = head.new_cache(slots, dtype, dev)
        emb = torch.randn(1, 1, c.hidden_size, device=dev, dtype=dtype)
        hid = torch.randn(1, 1, c.hidden_size, device=dev, dtype=dtype)
        pos = torch.tensor([[ctx]], device=dev)
        if args.profile and dev == "cuda":  # the draft step's kernels, eager (the graph replays the same ones)
            head(emb, hid, pos, dcache)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                head(emb, hid, pos, dcache)
                torch.cuda.synchronize()
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=20), flush=True)
        if args.cuda_graphs:
            graphed = graph_draft(head, dcache, c.hidden_size, [1], [1], capture)
            mask = torch.ones(1, 1, ctx + 1, dtype=torch.bool, device=dev)
            draft = timed(lambda: graphed(emb=emb, hidden=hid, positions=pos, slots=pos, mask=mask), args.iters, dev)
        else:
            draft = timed(lambda: head(emb, hid, pos, dcache), args.iters, dev)
        state = (torch.tensor([ctx], device=dev), torch.tensor([1], device=dev), hid[:, 0],
                 torch.randn(1, len(head.d2t), device=dev).log_softmax(-1))

        def draft_loop_of(tree: TreeConfig):
            """The whole draft loop of a round, as the engine runs it (graphed, or eager with host bookkeeping)."""
            if args.cuda_graphs:
                loop = GraphedDraftLoop(head, model.embed_tokens, dcache, tree, [1], capture)
                return lambda: loop(*state)
            return lambda: draft_trees(head, model.embed_tokens, dcache, [ctx], [1], state[2], state[3], tree)

        # one more step of the greedy chain loop: the best of 3 timings of chains of 8 and of 2, differenced
        short, long = (min(timed(draft_loop_of(TreeConfig(s, 1, s + 1)), args.iters, dev) for _ in range(3))
                       for s in (2, 8))
        draft_in_chain = (long - short) / 6
        draft_loop = timed(draft_loop_of(TreeConfig(6, 10, 60)), args.iters, dev)  # an EAGLE-2 tree, 60 tokens
    roofline = weight_bytes / bandwidth
    from toolkit.infer.kernels.epilogues import enabled as epilogues_enabled  # imports Triton: only once the
    from toolkit.infer.kernels.pdl import enabled as pdl_enabled, max_rows    # steps ran
    predicted = {f"tau={tau}, chain k={k}": round(tau * decode / (verify.get(k + 1, verify[8]) + k * draft_in_chain),
                                                  2)
                 for tau in (2, 3, 4) for k in (3, 7) if k + 1 in verify}
    out = {"config": args.config, "device": torch.cuda.get_device_name() if dev == "cuda" else dev,
           "dtype": args.dtype, "context": ctx, "cache_slots": slots, "kernels": args.kernels,
           "cuda_graphs": args.cuda_graphs, "pdl": args.kernels == "triton" and pdl_enabled(torch.device(dev)),
           "pdl_max_rows": max_rows(torch.device(dev)),
           "epilogues": args.kernels == "triton" and epilogues_enabled(torch.device(dev)),
           "weight_gb": round(weight_bytes / 1e9, 3),
           "copy_bandwidth_gb_s": round(bandwidth / 1e9, 1), "decode_ms": round(decode * 1e3, 3),
           "decode_tok_s": round(1 / decode, 1), "kernels_per_decode_step": kernels_per_step, "roofline_ms": round(roofline * 1e3, 3),
           "decode_vs_roofline": round(roofline / decode, 3),
           "verify_ms": {n: round(t * 1e3, 3) for n, t in verify.items()},
           "verify_vs_decode": {n: round(t / decode, 3) for n, t in verify.items()},
           "draft_step_ms": round(draft * 1e3, 3), "draft_vs_decode": round(draft / decode, 3),
           "draft_step_in_chain_ms": round(draft_in_chain * 1e3, 3),
           "draft_in_chain_vs_decode": round(draft_in_chain / decode, 3),
           "draft_loop_tree60_ms": round(draft_loop * 1e3, 3),
           "predicted_bs1_speedup": predicted}
    if args.engine:
        del cache, dcache
        out["engine"] = engine_figures(model, head, ctx, args.engine, args.cuda_graphs, capture, args.profile)
    print(json.dumps(out, indent=2))


def engine_figures(model, head, ctx: int, new_tokens: int, graphs: bool, capture, profile: bool = False) -> dict:
    """The Engine's own loop (host bookkeeping, graph input copies, cache compaction included) over a
    ctx-token random prompt: tokens/s of plain decoding, and ms per round for a chain and a tree."""
    from toolkit.infer.engine import Engine
    from toolkit.infer.sampling import SamplingParams

    prompt = torch.randint(0, model.config.vocab_size, (ctx,)).tolist()
    params = SamplingParams(max_new_tokens=new_tokens)
    figures = {}
    for name, draft, tree in (("plain", None, None), ("chain5", head, TreeConfig(5, 1, 6)),
                              ("tree6x10_60", head, TreeConfig(6, 10, 60))):
        eng = Engine(model, draft, tree, max_len=ctx + new_tokens + 8, cuda_graphs=graphs, graph_capture=capture)
        eng.generate(prompt, SamplingParams(max_new_tokens=8))  # warm-up
        if profile and name in ("plain", "chain5"):  # where the host time of a round goes
            import cProfile
            import pstats

            with cProfile.Profile() as pr:
                eng.generate(prompt, params)
            pstats.Stats(pr).sort_stats("tottime").print_stats(25)
            pstats.Stats(pr).sort_stats("cumulative").print_stats(30)
        r = eng.generate(prompt, params)
        step_s = r.seconds["draft"] + r.seconds["verify"]
        figures[name] = {"new_tokens": len(r.tokens), "rounds": r.verify_steps, "tau": round(r.tau, 3),
                         "decode_tok_s": round((len(r.tokens) - 1) / step_s, 1),
                         "round_ms": round(step_s / r.verify_steps * 1e3, 3),
                         "draft_ms_per_round": round(r.seconds["draft"] / r.verify_steps * 1e3, 3),
                         "verify_ms_per_round": round(r.seconds["verify"] / r.verify_steps * 1e3, 3),
                         "prefill_ms": round(r.seconds["prefill"] * 1e3, 1)}
        del eng
    return figures


if __name__ == "__main__":
    main()
