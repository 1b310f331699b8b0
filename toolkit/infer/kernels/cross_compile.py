"""Triton launches compiled, not run, for a GPU that is not here (kernels/aot.py drives the engine's steps through
this): inside `compiled_for`, every @triton.jit launch compiles for sm_<arch> with Triton's own compiler and the
ptxas it ships and returns unrun; `resources` and `before_wait` read a compiled kernel's registers, spills and
shared memory (cuobjdump) and what its PTX issues before a programmatic-dependent-launch wait."""
from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile
from pathlib import Path

import torch

from toolkit.infer.kernels.shared_memory import OPTIN_BYTES

# SMs (for the attention splits) and compute capability x 10 of the devices it knows by name; only the first
# two have tuned GEMV configs (gemv_configs.json): the others compile the untuned defaults, as they run there
SMS = {"NVIDIA H100 80GB HBM3": 132, "NVIDIA H200": 132, "NVIDIA A100-SXM4-80GB": 108, "NVIDIA L40S": 142,
       "NVIDIA GeForce RTX 4090": 128, "NVIDIA L4": 58, "NVIDIA A10": 72, "NVIDIA GeForce RTX 3090": 82,
       "Tesla T4": 40, "Tesla V100-SXM2-32GB": 80}
ARCH = {"NVIDIA H100 80GB HBM3": 90, "NVIDIA H200": 90, "NVIDIA A100-SXM4-80GB": 80, "NVIDIA L40S": 89,
        "NVIDIA GeForce RTX 4090": 89, "NVIDIA L4": 89, "NVIDIA A10": 86, "NVIDIA GeForce RTX 3090": 86,
        "Tesla T4": 75, "Tesla V100-SXM2-32GB": 70}


class _Target:
    """A stand-in for Triton's CUDA driver: it names the target, and nothing is ever launched through it."""

    def __init__(self, arch: int):
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", arch, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target

    def get_active_torch_device(self):
        return torch.device("meta")


@contextlib.contextmanager
def compiled_for(arch: int, device_name: str, pdl: bool = False):
    """Inside, Triton launches compile for sm_<arch> and return unrun (their outputs stay uninitialised); the
    GEMV configs and attention splits are those of `device_name`, the shared memory per block sm_<arch>'s; pdl:
    the launches use programmatic dependent launch (sm_90+; kernels/pdl.py). Yields the list [(kernel function,
    step label cell, CompiledKernel)] the launches fill; set `label[0]` to name the step that runs next."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("compiled_for needs TRITON_INTERPRET unset (the interpreter compiles nothing)")
    if pdl and arch < 90:
        raise ValueError(f"programmatic dependent launch needs sm_90 or later; got sm_{arch}")
    if arch not in OPTIN_BYTES:
        raise ValueError(f"sm_{arch}'s shared memory per block is not known; known: {sorted(OPTIN_BYTES)}")
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction

    from toolkit.infer.kernels import gemv, pdl as pdl_module, shared_memory, tree_attention

    launches, label, run, saved = [], [None], JITFunction.run, driver._active
    touched = set()

    def compile_only(self, *args, grid, warmup, **kwargs):
        if self not in touched:  # its per-device cache may hold another target's binder
            self.device_caches.clear()
            touched.add(self)
        kernel = run(self, *args, grid=grid, warmup=True, **kwargs)
        launches.append((self, label[0], kernel))
        return kernel

    patched = [(gemv, "_device_name", lambda device: device_name),
               (tree_attention, "_num_sms", lambda device: SMS.get(device_name, 132)),
               (pdl_module, "enabled", lambda device: pdl),
               (shared_memory, "max_shared", lambda device: OPTIN_BYTES[arch]),
               (shared_memory, "operands_in_shared", lambda device: arch // 10 in (9, 10)),
               (shared_memory, "async_copies", lambda device: arch >= 80)]
    originals = [getattr(m, n) for m, n, _ in patched]
    driver.set_active(_Target(arch))
    JITFunction.run = compile_only
    for m, n, f in patched:
        setattr(m, n, f)
    try:
        yield launches, label
    finally:
        JITFunction.run = run
        driver._active = saved
        for (m, n, _), f in zip(patched, originals):
            setattr(m, n, f)
        for fn in touched:
            fn.device_caches.clear()


def resources(cubin: bytes) -> dict:
    """{"registers", "local_bytes", "shared_bytes"} of the one function in a cubin (cuobjdump
    --dump-resource-usage, the tool Triton ships beside ptxas)."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True,
                              check=True).stdout
    got = {k: int(v) for k, v in re.findall(r"\b(REG|LOCAL|SHARED):(\d+)", text.split("Function", 1)[1])}
    return {"registers": got["REG"], "local_bytes": got["LOCAL"], "shared_bytes": got["SHARED"]}


def before_wait(ptx: str) -> tuple[int, int]:
    """(global loads, global stores and atomics) in a kernel's PTX before its first griddepcontrol.wait, (-1, -1)
    without one. The PTX is one straight-line prologue up to the wait (no branch precedes it), so its text order is
    the order they issue in."""
    pre, found, _ = ptx.partition("griddepcontrol.wait")
    if not found:
        return -1, -1
    loads = r"\bld\.global|\bcp\.async\.(?:ca|cg)\.shared\.global|\bcp\.async\.bulk"  # the async copies too
    return len(re.findall(loads, pre)), len(re.findall(r"\b(?:st|atom|red)\.global", pre))
