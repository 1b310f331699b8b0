"""How much shared memory one program may take on the device a kernel launches on, and the pipeline depth and
tile that fit in it. Triton compiles any tile; the launch then fails (OutOfResources) when the program's shared
memory is over the device's opt-in limit per block: 227 KB on an H100 / H200, 163 KB on an A100, but 99 KB on
the sm_86 / sm_89 / sm_120 parts (RTX 3090 / 4090 / 5090, A10, L4, L40S). The configs tuned on an H100 / H200 and
the untuned default (a 4-stage 16 x 64 x 256 rows tile: 120 KB) fit the first two and not the third, so the
kernels that pipeline tiles (the rows GEMV, tree attention) ask `fit` for the deepest pipeline <= their own that
fits, then a smaller tile, by upper bounds on their shared memory written here (`rows_shared_bytes`,
`attention_shared_bytes`) from what Triton gave them compiled for sm_75 / 80 / 86 / 89 / 90 / 120
(kernels/aot.py); tests/infer/kernels/test_aot.py compiles them for each and checks the compiled kernels against
both the limit and the bound."""
from __future__ import annotations

import functools

import torch

# opt-in shared memory per block by compute capability x 10 (CUDA C Programming Guide, "Compute Capabilities"),
# for kernels/aot.py, which compiles for a GPU that is not here
OPTIN_BYTES = {70: 98304, 75: 65536, 80: 166912, 86: 101376, 87: 166912, 89: 101376, 90: 232448, 100: 232448,
               103: 232448, 120: 101376, 121: 101376}


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


def rows_shared_bytes(block_m: int, block_n: int, block_k: int, stages: int, itemsize: int, pipelined: bool = True,
                      swap_in_shared: bool = False, norm: bool = False, pdl: bool = False) -> int:
    """An upper bound on a _rows_kernel program's shared memory (kernels/gemv_rows.py): stages - 1 tiles of x's
    BLOCK_M rows and W's BLOCK_N in flight (cp.async, sm_80+), all `stages` where SWAP's products run on wgmma /
    tcgen05 from shared memory (swap_in_shared), one more with PDL's peeled first tile; a folded norm's weights per
    tile and x's normed tile (norm); the accumulator's layout change; before sm_80 no pipeline, but W's tile
    through shared memory as fp32; 1 KB of slack."""
    buffers = (stages if swap_in_shared else max(stages - 1, 1)) + pdl
    total = buffers * (block_m + block_n + norm) * block_k * itemsize + block_m * block_n * 4 + 1024
    if norm:
        total += block_m * block_k * itemsize
    return total + (0 if pipelined else block_n * block_k * 4)


@functools.lru_cache(maxsize=None)
def rows_tile(block_m: int, block_n: int, block_k: int, stages: int, itemsize: int, flags: tuple,
              limit: int | None) -> tuple[int, int]:
    """(stages, BLOCK_K) for a _rows_kernel config on a device of `limit` bytes a block; flags: rows_shared_bytes's
    (pipelined, swap_in_shared, norm, pdl). Cached: an eager step asks once per GEMV; fit's search costs ~3 us."""
    return fit(stages, block_k, lambda s, k: rows_shared_bytes(block_m, block_n, k, s, itemsize, *flags), limit)


def attention_shared_bytes(block_r: int, block_s: int, block_d: int, stages: int, itemsize: int,
                           q_bytes: int | None = None) -> int:
    """An upper bound on an _attention_kernel program's shared memory (kernels/tree_attention.py): stages - 1 K and
    V tiles in flight, the q tile at q_bytes an element (default itemsize; twice that where sm_90's wgmma reads it
    from shared memory; 4 before sm_80, where an operand passes through there as fp32), its scores, 1 KB of
    slack."""
    kv = max(stages - 1, 1) * 2 * block_s * block_d * itemsize
    return kv + block_r * block_d * (q_bytes or itemsize) + block_r * block_s * 4 + 1024


@functools.lru_cache(maxsize=None)
def attention_tile(block_r: int, block_s: int, block_d: int, itemsize: int, q_bytes: int,
                   limit: int | None) -> tuple[int, int, int]:
    """(stages, BLOCK_R, BLOCK_S) for a device of `limit` bytes a block: 3 stages or fewer, then fewer rows a
    program, then (fp32 at head_dim 256 on a T4) half the slots a block. Cached: an eager step asks once a layer."""
    candidates = [block_s, block_s // 2] if block_s >= 32 else [block_s]
    for i, s in enumerate(candidates):
        try:
            stages, rows = fit(3, block_r, lambda st, r: attention_shared_bytes(r, s, block_d, st, itemsize, q_bytes),
                               limit)
            return stages, rows, s
        except ValueError:
            if i == len(candidates) - 1:
                raise
