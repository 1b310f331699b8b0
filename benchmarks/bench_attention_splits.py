"""How kernels/tree_attention.py's split of the KV slots sets a decode / verify / draft step's attention time, where
the step is latency-bound (batch 1, ~1k slots: ~4 MB of K/V per layer, ~1 us of streaming at 4 TB/s).

    python benchmarks/bench_attention_splits.py                   # CUDA, bf16, Llama-3.1-8B heads
    python benchmarks/bench_attention_splits.py --device cpu --dtype float32 --slots 200 --heads 4,2,16 --reps 1
                                                                  # CPU smoke run (TRITON_INTERPRET=1)

For each (slots S in use, new tokens T; --cache: the slots attended, as a graph attends over its whole cache)
and each (block_s, splits, warps) it prints one call's median microseconds (graph
replay, as the engine runs it; the merge kernel included when there are several splits), with "auto" the
default heuristic's pick ("defaults_us": tree_attention's own defaults), and checks every variant against the
float32 reference. JSON on stdout.
"""
from __future__ import annotations

import argparse
import inspect
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_attention import median_us, tree_mask  # noqa: E402

from toolkit.infer.kernels.tree_attention import reference_attention, tree_attention  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--heads", default="32,8,128", help="query heads, kv heads, head dim")
    ap.add_argument("--slots", default="1025,4097")
    ap.add_argument("--tokens", default="1,8")
    ap.add_argument("--cache", type=int, default=0,
                    help="cache slots attended (the mask's width), the sequence's `slots` of them in use: a CUDA "
                         "graph attends over the whole cache (0: the slots)")
    ap.add_argument("--block-s", default="32,64,128")
    ap.add_argument("--splits", default="auto,1,4,8,16,32,64")
    ap.add_argument("--warps", default="2,4,8")
    ap.add_argument("--reps", type=int, default=50, help="milliseconds of repeats per figure (CUDA)")
    args = ap.parse_args()
    dev, dtype = args.device, getattr(torch, args.dtype)
    hq, hkv, d = (int(x) for x in args.heads.split(","))
    g = torch.Generator().manual_seed(0)
    rows = []
    for S in (int(x) for x in args.slots.split(",")):
        for T in (int(x) for x in args.tokens.split(",")):
            q = torch.randn(1, hq, T, d, generator=g).to(dev, dtype)
            width = max(args.cache, S)
            k = torch.randn(1, hkv, width, d, generator=g).to(dev, dtype)
            v = torch.randn(1, hkv, width, d, generator=g).to(dev, dtype)
            mask = torch.zeros(1, T, width, dtype=torch.bool, device=dev)
            mask[..., :S] = tree_mask(1, T, S, dev, g)
            lens = torch.tensor([S], dtype=torch.int32, device=dev)
            ref = reference_attention(q.float(), k.float(), v.float(), mask)
            variants = [(bs, sp, nw) for bs in map(int, args.block_s.split(",")) for sp in args.splits.split(",")
                        for nw in map(int, args.warps.split(","))]
            for bs, sp, nw in variants:
                splits = None if sp == "auto" else int(sp)
                if splits is not None and splits * bs > 2 * S + bs:  # more splits than blocks: empty programs
                    continue

                def call(bs=bs, splits=splits, nw=nw):
                    return tree_attention(q, k, v, mask, lens=lens, splits=splits, block_s=bs, num_warps=nw)

                err = (call().float() - ref).abs().max().item()
                us = median_us(call, dev, args.reps)
                rows.append({"slots": S, "tokens": T, "block_s": bs, "splits": sp, "warps": nw, "us": round(us, 2),
                             "max_abs_err": round(err, 5)})
                print(f"S={S:>6} T={T:>3} block_s={bs:>4} splits={sp:>5} warps={nw}: {us:8.2f} us  err {err:.1e}",
                      file=sys.stderr, flush=True)
    best = {}
    for r in rows:
        key = f"S={r['slots']} T={r['tokens']}"
        if key not in best or r["us"] < best[key]["us"]:
            best[key] = r
    default = {name: prm.default for name, prm in inspect.signature(tree_attention).parameters.items()}
    auto = {f"S={r['slots']} T={r['tokens']}": r["us"] for r in rows if r["splits"] == "auto"
            and r["block_s"] == default["block_s"] and r["warps"] == default["num_warps"]}
    print(json.dumps({"device": torch.cuda.get_device_name() if dev == "cuda" else dev, "dtype": args.dtype,
                      "cache": args.cache,
                      "heads": [hq, hkv, d], "rows": rows, "best": best, "defaults_us": auto}, indent=1))
    if any(r["max_abs_err"] > (2e-2 if dtype != torch.float32 else 1e-4) for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
