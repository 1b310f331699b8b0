"""A kernel switch on and off, side by side: programmatic dependent launch (TOOLKIT_PDL, kernels/pdl.py) or the
paired epilogues (TOOLKIT_EPILOGUES, kernels/epilogues.py). Either must change how the kernels run and never what
they compute: PDL only when they start, the epilogues only where a product goes (each row's sum is the unfused
kernel's with the same config). So the graphed decode step, a verify step of 8 tokens and a greedy draft chain of
8 (random Llama-3.1-8B-shaped bf16 target and EAGLE-3 head, --kernels triton, 1k context) must give bit-identical
logits and tokens both ways (the GEMVs sum in a fixed order: no split-K, no atomics), and their times show what
the switch buys.

    python benchmarks/bench_switch.py --switch pdl        # on a GPU; PDL needs sm_90+ (elsewhere both runs are off)
    python benchmarks/bench_switch.py --switch epilogues  # on a GPU
    TOOLKIT_PDL=on python benchmarks/bench_switch.py --switch pdl_rows  # PDL on one-row launches, then on <= 16 rows
    python benchmarks/bench_switch.py --config tiny --device cpu --dtype float32 --kernels torch --iters 1 \
        --context 64                                      # a smoke run of the script (no Triton, no PDL on a CPU)

Prints JSON; exits 1 when the outputs differ (off, on, then off again: the last run is the control).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

import torch

from bench_gpu import CONFIGS, random_models, timed
from toolkit.infer.graphs import GraphedDraftLoop, eager_capture, graph_target
from toolkit.infer.kv_cache import KVCache
from toolkit.infer.tree import TreeConfig

# --switch: the environment variable it sets, its "off" and "on" values, and the module function of the device
# that says what the kernels then do. pdl_rows: PDL (TOOLKIT_PDL as set outside) on the one-row launches, then on
# every launch of up to 16 rows (the verify step's too; kernels/pdl.py's max_rows)
SWITCHES = {"pdl": ("TOOLKIT_PDL", "off", "on", "toolkit.infer.kernels.pdl", "enabled"),
            "epilogues": ("TOOLKIT_EPILOGUES", "off", "on", "toolkit.infer.kernels.epilogues", "enabled"),
            "pdl_rows": ("TOOLKIT_PDL_MAX_ROWS", "1", "16", "toolkit.infer.kernels.pdl", "max_rows")}


def run(model, head, c, ctx: int, dev: str, dtype, iters: int, capture) -> tuple[dict, dict]:
    """Outputs and times of the three steps, captured afresh under the switch's current setting."""
    torch.manual_seed(1)  # the same cache contents and inputs for either mode
    cache = KVCache(c, 1, ctx + 80, dtype, dev)
    cache.k.normal_()
    cache.v.normal_()
    dcache = head.new_cache(ctx + 80, dtype, dev)
    dcache.k.normal_()
    dcache.v.normal_()
    outputs, times = {}, {}
    for n in (1, 8):
        tokens = torch.randint(0, c.vocab_size, (1, n), device=dev)
        positions = torch.arange(ctx, ctx + n, device=dev)[None]
        mask = torch.ones(1, n, ctx + n, dtype=torch.bool, device=dev).tril(diagonal=ctx)
        graphed = graph_target(model, cache, [], [1], [n], capture)
        step = lambda: graphed(tokens=tokens, positions=positions, slots=positions, mask=mask)  # noqa: E731
        outputs[f"logits {n}"] = step()[0].float().cpu()  # a step rewrites the same slots with the same k / v
        times[f"{'decode' if n == 1 else f'verify{n}'}_ms"] = timed(step, iters, dev) * 1e3
    state = (torch.tensor([ctx], device=dev), torch.tensor([1], device=dev),
             torch.randn(1, c.hidden_size, device=dev, dtype=dtype),
             torch.randn(1, len(head.d2t), device=dev).log_softmax(-1))
    chains = {}
    for s in (2, 8):
        loop = GraphedDraftLoop(head, model.embed_tokens, dcache, TreeConfig(s, 1, s + 1), [1], capture)
        chains[s] = min(timed(lambda: loop(*state), iters, dev) for _ in range(3))
        outputs[f"chain of {s}"] = [o.float().cpu() for o in loop(*state) if torch.is_tensor(o)]
    times["draft_step_in_chain_ms"] = (chains[8] - chains[2]) / 6 * 1e3
    return outputs, {k: round(v, 4) for k, v in times.items()}


def same(a, b) -> bool:
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return torch.equal(a, b)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", choices=sorted(CONFIGS), default="llama3.1-8b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--kernels", choices=["torch", "triton"], default="triton")
    ap.add_argument("--switch", choices=sorted(SWITCHES), default="pdl")
    args = ap.parse_args()
    dev, dtype, c = args.device, getattr(torch, args.dtype), CONFIGS[args.config]
    if dev == "cpu" and args.kernels == "triton":  # interpreted on a CPU: set before Triton is first imported
        os.environ.setdefault("TRITON_INTERPRET", "1")
    env, off, on, module, attr = SWITCHES[args.switch]
    state = getattr(importlib.import_module(module), attr)
    model, head = random_models(c, dev, dtype, args.kernels)
    capture = None if dev == "cuda" else eager_capture
    report, outs = {"config": args.config, "device": torch.cuda.get_device_name() if dev == "cuda" else dev,
                    "dtype": args.dtype, "kernels": args.kernels, "context": args.context, "switch": env}, {}
    with torch.no_grad():
        for name, mode in (("off", off), ("on", on), ("off_again", off)):
            os.environ[env] = mode  # read at every launch; each run captures its own graphs
            outs[name], report[name] = run(model, head, c, args.context, dev, dtype, args.iters, capture)
            report[name][args.switch] = args.kernels == "triton" and state(torch.device(dev))
    # the control: off twice (were these to differ, the steps would not be deterministic to begin with)
    report["reproducible_without"] = {k: same(v, outs["off_again"][k]) for k, v in outs["off"].items()}
    report["identical"] = {k: same(v, outs["on"][k]) for k, v in outs["off"].items()}
    report["on_vs_off"] = {k: round(report["on"][k] / report["off"][k], 3) for k in report["off"] if k.endswith("_ms")}
    print(json.dumps(report, indent=2))
    return 0 if all(report["identical"].values()) and all(report["reproducible_without"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
