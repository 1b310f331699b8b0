"""Programmatic dependent launch (PDL, sm_90+) for the engine's Triton kernels: a kernel may launch, and its
programs become resident, while the kernel before it in the stream is still finishing.

Why: a batch-1 decode step of an 8B model is ~230 short kernels inside one CUDA graph. Between two of them the
GPU drains the first (its last programs finish one by one), then launches and starts the next, whose first
weight loads then take a DRAM round trip: a gap in which HBM streams nothing, paid ~230 times a step and ~10
times a draft step (an H200's small GEMVs stream at 2.9-3.0 TB/s against 3.9 for the large ones, and its decode
step sits at 84-88% of the roofline: benchmarks/RESULTS.md). With PDL each program

  1. loads what no kernel of a step ever writes (a GEMV's first weight tile: weights are read-only), then
  2. waits for the kernel before it (`gdc_wait`: that grid has completed and its writes are visible) before it
     reads or writes anything else (activations, the KV cache, its outputs),
  3. lets the next kernel launch (`gdc_launch_dependents`), whose programs then wait in step 2 while this
     kernel runs,

and is launched with `launch_pdl=True`. Why it stays exact: every PDL kernel waits for its predecessor's
completion before touching shared data, and completes only after that wait, so by induction every earlier kernel
has completed too; a launch without the flag (a torch op, cuBLAS) is serialized as always. kernels/aot.py checks
in the compiled PTX that nothing but a GEMV's weight loads comes before the wait (tests/infer/kernels/test_aot.py).

TOOLKIT_PDL picks it: "off", "on" (wherever the device supports it: CUDA, compute capability >= 9), or "auto"
(default): on where the device's entry in gemv_configs.json says `"pdl": true`, which a measurement on that
device sets (benchmarks/gpu/lease.sh times both). Off on CPU and under TRITON_INTERPRET=1.

TOOLKIT_PDL_MAX_ROWS=N (or the entry's "pdl_max_rows") keeps it to launches over at most N token rows: on an H200
PDL on every launch made the batch-1 decode step 4.8% faster and the verify step of 8 tokens 6.8% slower, and on
the one-row launches alone decode 11% and the draft step 12% faster with the verify step unchanged (RESULTS.md,
2026-11-27), when the verify step's row GEMV loaded nothing before its wait (it now loads its first tile too:
lease.sh measures both limits). A launch without PDL beside ones with it is exact: it neither starts early nor
lets the next kernel start before it ends.
"""
from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

MODES = ("auto", "on", "off")


@functools.lru_cache(maxsize=None)
def _capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def enabled(device: torch.device) -> bool:
    """Whether kernels launched on `device` use PDL (TOOLKIT_PDL, see the module's docstring)."""
    mode = os.environ.get("TOOLKIT_PDL", "auto")
    if mode not in MODES:
        raise ValueError(f"TOOLKIT_PDL={mode!r}; accepted: {', '.join(MODES)}")
    if mode == "off" or device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    if _capability(device)[0] < 9:
        return False
    if mode == "on":
        return True
    from toolkit.infer.kernels.gemv import _device_name, tuned_configs

    return bool(tuned_configs(_device_name(device)).get("pdl", False))


def max_rows(device: torch.device) -> int | None:
    """The most token rows a launch with PDL may cover (TOOLKIT_PDL_MAX_ROWS, else the device's "pdl_max_rows" in
    gemv_configs.json); None: any number."""
    raw = os.environ.get("TOOLKIT_PDL_MAX_ROWS")
    if raw is None:
        from toolkit.infer.kernels.gemv import _device_name, tuned_configs

        raw = tuned_configs(_device_name(device)).get("pdl_max_rows")
        if raw is None:
            return None
    try:
        limit = int(raw)
    except (TypeError, ValueError):
        limit = 0
    if limit < 1 or str(raw).strip() != str(limit):
        raise ValueError(f"TOOLKIT_PDL_MAX_ROWS / pdl_max_rows={raw!r}; accepted: a whole number of rows >= 1")
    return limit


def launch_kw(device: torch.device, rows: int = 1) -> dict:
    """The keyword arguments every launch in this package adds: the kernel's PDL constexpr, and Triton's launch
    flag where it is on for a launch over `rows` token rows (max_rows)."""
    if not enabled(device):
        return {"PDL": False}
    limit = max_rows(device)
    return {"PDL": True, "launch_pdl": True} if limit is None or rows <= limit else {"PDL": False}


@triton.jit
def wait_prior(PDL: tl.constexpr):
    """Step 2 and 3 above, at the point of a kernel before which it reads or writes nothing another kernel writes."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
