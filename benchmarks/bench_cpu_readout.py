"""The packed readout on a CPU (toolkit/infer/cpu_gemm.py): a vocabulary projection's fp32 GEMM by row count, from
the [in, out] weight the engine keeps (in_out_storage), from PyTorch's [out, in], and from oneDNN's packed copy;
then the whole target step of SmolLM2 (or a random model of a hub shape) by token count with the packed copy off
and on, interleaved call by call in one process (so the box's drift hits both alike).

    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 MALLOC_TOP_PAD_=1073741824 \\
        python benchmarks/bench_cpu_readout.py [--vocab 49152 --hidden 576] [--shape smollm2 | gemma-3-270m] \\
            [--rows 1 2 4 8 16] [--context 300] [--calls 24] [--threads 1] [--out result.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F


def median_ms(fn, calls: int) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def readout_alone(vocab: int, hidden: int, rows: list[int], calls: int) -> dict:
    """ms per GEMM [rows, hidden] x [hidden, vocab] from each layout."""
    from toolkit.infer.cpu_gemm import ROWS_HINT

    w = torch.randn(vocab, hidden) * 0.02
    in_out = w.t().contiguous().t()
    packed = torch.ops.mkldnn._reorder_linear_weight(w, ROWS_HINT)
    out = {}
    for n in rows:
        x = torch.randn(n, hidden)
        out[n] = {"in_out": median_ms(lambda: F.linear(x, in_out), calls),
                  "out_in": median_ms(lambda: F.linear(x, w), calls),
                  "packed": median_ms(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""),
                                      calls)}
    return out


def target(shape: str):
    from toolkit.infer.loading import load_target
    from toolkit.models import resolve_target

    if shape == "smollm2":
        return load_target(resolve_target())
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from bench_families import build  # the hub shapes, as random models

    folder = Path(tempfile.mkdtemp())
    build(shape, folder)  # (transformers' copy is dropped at once)
    return load_target(folder)


def target_steps(shape: str, rows: list[int], context: int, calls: int) -> dict:
    """ms per target step of n tokens after a `context`-token prefill, the packed readout off / on."""
    from toolkit.infer.kv_cache import KVCache

    from toolkit.infer.cpu_gemm import PackedReadout

    model = target(shape)
    if getattr(model.lm_head, "packed", None) is None:
        raise SystemExit("no packed readout here (oneDNN missing, or not a CPU fp32 target)")
    cache = KVCache(model.config, 1, context + max(rows) + 1)
    vocab = model.config.vocab_size
    out = {}
    with torch.no_grad():
        model(torch.randint(0, vocab, (1, context)), torch.arange(context)[None], cache, torch.arange(context)[None])
        for n in rows:
            ids, pos = torch.randint(0, vocab, (1, n)), torch.arange(context, context + n)[None]
            mask = None if n == 1 else torch.arange(context + n)[None, None, :] <= pos[:, :, None]
            times = {"off": [], "on": []}
            for i in range(2 * calls + 4):  # off, on, off, on, ...: the first two of each are warm-ups
                which = "on" if i % 2 else "off"
                model.lm_head.__class__ = PackedReadout if which == "on" else torch.nn.Linear  # its copy is kept
                start = time.perf_counter()
                model(ids, pos, cache, pos.clone(), mask)
                times[which].append(time.perf_counter() - start)
            out[n] = {k: statistics.median(v[2:]) * 1000 for k, v in times.items()}
    model.lm_head.__class__ = PackedReadout
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--shape", default="smollm2", help="smollm2 (the embedded target) or a bench_families shape")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--calls", type=int, default=12)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip-steps", action="store_true", help="time the readout alone")
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    result = {"vocab": args.vocab, "hidden": args.hidden, "threads": args.threads,
              "readout_ms": readout_alone(args.vocab, args.hidden, args.rows, args.calls)}
    for n, r in result["readout_ms"].items():
        print(f"readout {args.vocab} x {args.hidden}, {n:>2} rows: " + "  ".join(f"{k} {v:.2f} ms" for k, v in r.items()))
    if not args.skip_steps:
        result.update(shape=args.shape, context=args.context,
                      step_ms=target_steps(args.shape, args.rows, args.context, args.calls))
        for n, r in result["step_ms"].items():
            print(f"{args.shape} step of {n:>2} tokens: packed readout off {r['off']:.1f} ms, on {r['on']:.1f} ms "
                  f"({r['on'] / r['off']:.2f}x)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
