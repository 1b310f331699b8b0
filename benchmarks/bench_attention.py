"""Attention over the KV cache on a GPU: the Triton tree-attention kernel against torch SDPA, as the target's
verify / decode step calls them (Llama-3.1-8B heads: 32 query heads, 8 kv heads, head dim 128, bf16).

    python benchmarks/bench_attention.py                          # CUDA, bf16
    python benchmarks/bench_attention.py --device cpu --dtype float32 --slots 256 --tokens 1,8 --heads 4,2,32
                                                                  # CPU smoke run (TRITON_INTERPRET=1)

For each (cache slots S, new tokens T): median microseconds of one layer's attention for
  sdpa_mask   SDPA with the additive float mask [B, 1, T, S] the model builds (what --attention torch runs),
  triton      kernels/tree_attention.py with the bool mask [B, T, S],
  sdpa_nomask SDPA with no mask (decode of one sequence over exactly its slots: a lower bound, no tree),
and the kernel's max abs error against the float32 reference. Inputs are random (never zeros), the prefix
visible and a random tree over the T new tokens, so both paths compute the same masked attention.
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from toolkit.infer.kernels.tree_attention import reference_attention, tree_attention
from toolkit.infer.attention import attention_masks


def median_us(fn, device: str, reps: int) -> float:
    """One call's device time. On CUDA the calls are captured in a graph of 20 and its replays timed with
    events, as the engine replays them: Triton's host-side launch cost (tens of microseconds per call in
    Python) would otherwise be timed instead of the kernel."""
    if device == "cuda":
        import triton.testing

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(20):
                fn()
        return triton.testing.do_bench(graph.replay, warmup=25, rep=reps, return_mode="median") * 1e3 / 20
    fn()
    times = []
    for _ in range(3):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return sorted(times)[1] * 1e6


def tree_mask(B: int, T: int, S: int, device: str, generator: torch.Generator) -> torch.Tensor:
    """bool [B, T, S]: the first S - T slots visible, then a random tree (each node sees its ancestors)."""
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=generator)) for i in range(1, T)]
    anc = torch.eye(T, dtype=torch.bool)
    for i in range(1, T):
        anc[i] |= anc[parents[i]]
    m = torch.ones(B, T, S, dtype=torch.bool)
    m[:, :, S - T:] = anc
    return m.to(device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", default="32,8,128", help="query heads, kv heads, head dim")
    ap.add_argument("--slots", default="1024,4096,16384")
    ap.add_argument("--tokens", default="1,2,4,8,16,32,64")
    ap.add_argument("--reps", type=int, default=100, help="milliseconds of repeats per figure (CUDA)")
    args = ap.parse_args()
    dev, dtype = args.device, getattr(torch, args.dtype)
    hq, hkv, d = (int(x) for x in args.heads.split(","))
    g = torch.Generator().manual_seed(0)
    rows = []
    for S in (int(x) for x in args.slots.split(",")):
        for T in (int(x) for x in args.tokens.split(",")):
            B = args.batch
            q = torch.randn(B, T, hq, d, generator=g).to(dev, dtype).transpose(1, 2)   # the model's layout
            k = torch.randn(B, hkv, S, d, generator=g).to(dev, dtype)
            v = torch.randn(B, hkv, S, d, generator=g).to(dev, dtype)
            mask = tree_mask(B, T, S, dev, g)
            bias, _, _ = attention_masks(mask, dtype)
            _, mask8, lens = attention_masks(mask, dtype, "triton")  # as the model passes them: once per forward
            sdpa = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=hq != hkv)  # noqa: E731
            # (the model builds the float bias, or the int8 mask and lens, once per forward: not timed here)
            tri = lambda: tree_attention(q, k, v, mask8, lens=lens)  # noqa: E731
            plain = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=T > 1, enable_gqa=hq != hkv)  # noqa: E731
            want = reference_attention(q.float(), k.float(), v.float(), mask)
            err = (tri().float() - want).abs().max().item()
            row = {"slots": S, "tokens": T, "sdpa_mask_us": round(median_us(sdpa, dev, args.reps), 1),
                   "triton_us": round(median_us(tri, dev, args.reps), 1),
                   "sdpa_nomask_us": round(median_us(plain, dev, args.reps), 1), "triton_max_err": err}
            row["triton_speedup"] = round(row["sdpa_mask_us"] / row["triton_us"], 2)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\n{'S':>6} {'T':>3} {'sdpa+mask us':>13} {'triton us':>10} {'speedup':>8} {'sdpa nomask':>12} {'err':>8}")
    for r in rows:
        print(f"{r['slots']:>6} {r['tokens']:>3} {r['sdpa_mask_us']:>13} {r['triton_us']:>10} "
              f"{r['triton_speedup']:>8} {r['sdpa_nomask_us']:>12} {r['triton_max_err']:>8.1e}")


if __name__ == "__main__":
    main()
