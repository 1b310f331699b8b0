"""How fast this CPU multiplies matrices in fp32 and in bf16 / fp16, and the training precision that follows.

`toolkit quickstart` sizes its plan by the fp32 rate; training takes bf16 autocast on a CPU only where it pays.
A CPU with native bf16 (AVX512-BF16, AMX) ran the GEMM below 2.2x faster in bf16 and trained 1.5x the tokens/s
(RESULTS.md, 2026-11-25); one without (an AVX2-only EPYC) emulates bf16 at ~1 GFLOP/s, 1/74-1/113 of its fp32
rate, and a training step there took ~60x as long (RESULTS.md, 2026-11-26).
"""
from __future__ import annotations

import functools
import time

BF16_MIN_GAIN = 1.5  # half precision is chosen where its GEMM runs at least this many times the fp32 one
MAX_THREADS = 1024  # torch.set_num_threads(100000) crashed the process (a segfault, no message)


def threads_problem(threads: int | None, setting: str = "--threads") -> str | None:
    """What is wrong with a CPU thread count (None or 0: torch's default), or None."""
    if threads is not None and not 0 <= threads <= MAX_THREADS:
        return f"{setting} {threads}: give a number of CPU threads from 1 to {MAX_THREADS} (0 or none: torch's)"
    return None


def bf16_pays(fp32: float, bf16: float) -> bool:
    """The rule training and quickstart share: bf16 where its GEMM rate is >= BF16_MIN_GAIN x fp32's."""
    return bf16 >= BF16_MIN_GAIN * fp32


def measure_gflops(threads: int, reps: int = 5, dtype: str = "float32", seconds: float = 1.0,
                   rows: int = 1024) -> float:
    """GEMM rate of this CPU on `threads` threads: [rows, 576] x [576, 1536], the target's MLP shape at a
    training micro-batch, in fp32 (or bf16 / fp16). The best product of up to `reps` x 10 (~0.2 s on the
    reference box), stopping after `seconds`: emulated bf16 (~1 GFLOP/s) took 80 s for the 50 products."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(rows, 576, dtype=getattr(torch, dtype)), torch.randn(576, 1536, dtype=getattr(torch, dtype))
        a @ b  # warm-up: thread pool, pages
        best, start = float("inf"), time.perf_counter()
        for _ in range(reps * 10):
            t0 = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t0)
            if t0 - start > seconds:
                break
    finally:
        torch.set_num_threads(before)
    return 2 * rows * 576 * 1536 / best / 1e9


@functools.lru_cache
def quick_gflops(threads: int, dtype: str = "float32") -> float:
    """A quarter-size measure_gflops (0.45 GFLOP a product, <= ~1.5 s even for emulated bf16), once per process:
    enough to tell native half precision (~2x fp32) from emulated (~1/100 of fp32)."""
    return measure_gflops(threads, reps=2, dtype=dtype, seconds=0.25, rows=256)


HALF = {"bf16": "bfloat16", "fp16": "float16"}


def cpu_training_precision(requested: str, launched: str | None, threads: int, measure=None
                           ) -> tuple[str, str | None]:
    """The head's autocast for training on a CPU, and a line to print (None: nothing to say).
    requested: the recipe's mixed_precision (auto | no | bf16 | fp16); launched: what `accelerate launch` chose
    (ACCELERATE_MIXED_PRECISION; it exports "no" when given nothing). auto keeps a launch's bf16 / fp16, else
    takes bf16 where this CPU's bf16 GEMM is >= BF16_MIN_GAIN x its fp32 GEMM, else no. An explicit half
    precision is kept, with a warning when this CPU runs it slower than fp32. measure(threads, dtype) -> GFLOP/s
    (default quick_gflops)."""
    measure = measure or quick_gflops
    if requested == "auto" and launched in HALF:
        requested = launched
    if requested == "no":
        return "no", None
    if requested == "auto":
        fp32, bf16 = measure(threads, dtype="float32"), measure(threads, dtype="bfloat16")
        chosen = "bf16" if bf16_pays(fp32, bf16) else "no"
        return chosen, (f"[train] mixed_precision auto on this CPU: bf16 GEMM {bf16:.1f} GFLOP/s = {bf16 / fp32:.2f}x "
                        f"fp32 ({fp32:.1f}), so the head trains in {'bf16 (target too)' if chosen == 'bf16' else 'fp32'}")
    return requested, emulated_warning(f"[train] mixed_precision {requested}", HALF[requested], threads,
                                       "training will crawl. mixed_precision=no or auto trains in fp32 here", measure)


def emulated_warning(setting: str, dtype: str, threads: int, advice: str, measure=None) -> str | None:
    """A WARNING line naming `setting` and `advice` when this CPU runs `dtype` ("bfloat16" | "float16") GEMMs
    slower than fp32 (emulated); None where it does not. measure as in cpu_training_precision."""
    measure = measure or quick_gflops
    fp32, half = measure(threads, dtype="float32"), measure(threads, dtype=dtype)
    if half >= fp32:
        return None
    short = {name: short for short, name in HALF.items()}[dtype]
    return (f"WARNING {setting} on this CPU: its {short} GEMM runs {half:.1f} GFLOP/s against {fp32:.1f} in fp32 "
            f"({fp32 / half:.0f}x slower; no native {short}, e.g. no AVX512-BF16 / AMX): {advice}")
