"""How much shared memory one program may take on the device a kernel launches on, and the pipeline depth and
tile that fit in it. Triton compiles any tile; the launch then fails (OutOfResources) when the program's shared
memory is over the device's opt-in limit per block: 227 KB on an H100 / H200, 163 KB on an A100, but 99 KB on
the sm_86 / sm_89 / sm_120 parts (RTX 3090 / 4090 / 5090, A10, L4, L40S). The configs tuned on an H100 / H200 and
the untuned default (a 4-stage 16 x 64 x 256 rows tile: 120 KB) fit the first two and not the third, so the
kernels that pipeline tiles (the rows GEMV, tree attention) ask `fit` for the deepest pipeline <= their own that
fits, then a smaller tile. The estimates are the shared memory Triton gave those kernels compiled for sm_80 /
86 / 89 / 90 (kernels/aot.py), rounded up; tests/infer/kernels/test_aot.py compiles them for each and checks the
compiled kernels against the limit."""
from __future__ import annotations

import functools

import torch

# opt-in shared memory per block by compute capability x 10 (CUDA C Programming Guide, "Compute Capabilities"),
# for kernels/aot.py, which compiles for a GPU that is not here
OPTIN_BYTES = {75: 65536, 80: 166912, 86: 101376, 87: 166912, 89: 101376, 90: 232448, 100: 232448, 103: 232448,
               120: 101376, 121: 101376}


@functools.lru_cache(maxsize=None)
def max_shared(device: torch.device) -> int | None:
    """The device's opt-in shared memory per block in bytes, as Triton checks it at launch; None off CUDA (the
    interpreter has no limit)."""
    if device.type != "cuda":
        return None
    from triton.runtime import driver

    index = device.index if device.index is not None else torch.cuda.current_device()
    return int(driver.active.utils.get_device_properties(index)["max_shared_mem"])


@functools.lru_cache(maxsize=None)
def operands_in_shared(device: torch.device) -> bool:
    """Whether the matrix unit reads its operands from shared memory (sm_90's wgmma, sm_100's tcgen05; not the
    consumer sm_120, whose mma.sync reads registers): a kernel's register tile that feeds tl.dot (tree attention's
    q) then takes a copy there too, and a pipeline on it keeps all its stages there."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] in (9, 10)


@functools.lru_cache(maxsize=None)
def async_copies(device: torch.device) -> bool:
    """Whether Triton pipelines tile loads through shared memory here (cp.async, sm_80 and later). Before (a T4's
    sm_75) it does not, and a tl.dot operand tile goes through shared memory as fp32 instead (the rows GEMV's 16 x 64
    x 256 fp16 tile took 64 KB there, 64 x 256 x 4 bytes, at any number of stages)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 0)


def fit(stages: int, tile: int, need, limit: int | None, min_tile: int = 16) -> tuple[int, int]:
    """(stages, tile): the deepest pipeline <= `stages` (down to 2) whose need(stages, tile) bytes fit in `limit`,
    else the largest tile (halved, >= min_tile) that fits with 2 stages; need is the kernel's upper bound on its
    program's shared memory. Unchanged when limit is None. Refuses, naming the figures, when nothing fits."""
    if limit is None:
        return stages, tile
    for s in range(stages, min(stages, 2) - 1, -1):
        if need(s, tile) <= limit:
            return s, tile
    s, t = min(stages, 2), tile
    while t > min_tile:
        t //= 2
        if need(s, t) <= limit:
            return s, t
    raise ValueError(f"no tile fits in this device's {limit} bytes of shared memory per block: {need(s, t)} at "
                     f"{s} stages and a tile of {t}")
