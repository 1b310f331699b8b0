"""Attention with sinks (gpt-oss) over a causal prefill, on the torch path: peak memory and time of
`eager_attention` with its queries in chunks (the default, at most 2^26 scores at once) against all B x Hq x T x S
scores at once (`--block 0`). Each setting runs in its own process, so its peak RSS is its own.

    python benchmarks/bench_sink_attention.py --tokens 4096                 # gpt-oss heads: 64 q, 8 kv, dim 64
    python benchmarks/bench_sink_attention.py --tokens 1024 --block 0       # one setting only
"""
from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time


def one(tokens: int, block: int, heads: int, kv_heads: int, dim: int) -> str:
    import torch

    from toolkit.infer.attention import eager_attention

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, heads, tokens, dim, generator=g)
    k, v = (torch.randn(1, kv_heads, tokens, dim, generator=g) for _ in range(2))
    sinks = torch.randn(heads, generator=g)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    out = eager_attention(q, k, v, None, sinks, block or 1 << 62)
    seconds = time.perf_counter() - start
    peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 2 ** 20  # KiB -> GiB
    return (f"tokens {tokens} block {'all' if not block else block}: peak +{peak:.2f} GiB, {seconds:.1f} s, "
            f"output mean abs {out.abs().mean():.6f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--block", type=int, default=None, help="scores per chunk; 0: all at once; absent: both")
    p.add_argument("--heads", type=int, default=64)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=64)
    a = p.parse_args()
    if a.block is not None:
        print(one(a.tokens, a.block, a.heads, a.kv_heads, a.dim))
        return
    for block in (0, 1 << 26):  # each in a fresh process: ru_maxrss is a process's high-water mark
        cmd = [sys.executable, __file__, "--tokens", str(a.tokens), "--block", str(block), "--heads", str(a.heads),
               "--kv-heads", str(a.kv_heads), "--dim", str(a.dim)]
        print(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
