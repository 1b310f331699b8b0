"""KV cache allocated once: k/v [layers, batch, kv heads, max_len, k/v head dim]; tokens are written to the
slots the caller gives (per sequence), so tree tokens can be written and later overwritten."""
from __future__ import annotations

import torch

from toolkit.infer.config import ModelConfig


def cache_bytes(config: ModelConfig, batch: int, max_len: int, dtype=torch.float32) -> int:
    """Bytes of a cache (k and v, all layers) of `batch` sequences of `max_len` slots."""
    heads, k_dim, v_dim = config.cache_dims
    return config.num_layers * heads * (k_dim + v_dim) * torch.finfo(dtype).bits // 8 * batch * max_len


def max_len_for_memory(config: ModelConfig, budget_bytes: int, batch: int = 1, dtype=torch.float32) -> int:
    """The longest per-sequence cache (k and v, all layers) that fits `budget_bytes` for `batch` sequences."""
    return int(budget_bytes // cache_bytes(config, batch, 1, dtype))


def check_fits(config: ModelConfig, batch: int, max_len: int, dtype, device, spare_rows: int = 0) -> None:
    """Refuse a cache larger than the device's free memory, naming the figures and what fits, rather than fail in
    the allocator (a CUDA OOM) or be killed later as the lazily committed pages fill (a CPU)."""
    try:
        free = free_memory_bytes(device)
    except (OSError, KeyError):  # no /proc/meminfo: not Linux
        return
    need = cache_bytes(config, batch + spare_rows, max_len, dtype)
    if need > free:
        fits = max_len_for_memory(config, free, batch + spare_rows, dtype)
        rows = f"{batch} sequences" + (f" (+ {spare_rows} prefix-cache rows)" if spare_rows else "")
        raise ValueError(f"the KV cache for {rows} of {max_len} tokens needs {need / 1e9:.1f} GB and the "
                         f"{torch.device(device).type} has {free / 1e9:.1f} GB free: lower the batch "
                         f"(--max-batch-size) or the length (--max-seq-len: {fits} fits this batch; 0 sizes it "
                         "from free memory)")


def cache_length(config: ModelConfig, max_len: int | None, batch: int, spare_rows: int, memory_fraction: float,
                 dtype, device) -> int:
    """The engine's per-sequence cache length: max_len, or (None) what memory_fraction of the free memory holds
    for batch + spare_rows rows, capped by the target's positions and context limit; refused when the target is
    not exact that far (a sliding window, a length-dependent rope), when it is under 2 slots or does not fit."""
    if max_len is None:
        budget = int(free_memory_bytes(device) * memory_fraction)
        max_len = min(max_len_for_memory(config, budget, batch + spare_rows, dtype), config.max_position_embeddings,
                      config.context_limit()[0] or config.max_position_embeddings)
    config.check_max_len(max_len)
    if max_len < 2:
        raise ValueError(f"KV cache of {max_len} slots is too small: lower the batch or free memory")
    check_fits(config, batch, max_len, dtype, device, spare_rows)
    return max_len


def utilization_budget(device: torch.device | str, utilization: float) -> int:
    """Bytes a KV cache may take so that this process holds at most `utilization` of the device's memory (vLLM's
    --gpu-memory-utilization, SGLang's --mem-fraction-static: a limit per server, whatever others hold): that share
    of the total less what this process holds now (the loaded model), and no more than is free. On a CPU, of RAM
    (Linux /proc/meminfo; what the process holds: its resident pages)."""
    import os

    device = torch.device(device)
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        held = torch.cuda.memory_reserved(device)
    else:
        free, total = meminfo_bytes("MemAvailable", "MemTotal")
        with open("/proc/self/statm") as f:
            held = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return int(min(utilization * total - held, free))


def free_memory_bytes(device: torch.device | str) -> int:
    """Free accelerator memory, or available RAM on CPU (Linux /proc/meminfo). On CUDA that is the driver's free
    memory plus what PyTorch's caching allocator holds reserved but unused, which this process allocates first
    (an engine built after another in one process, as bench's sweep does, was refused memory it could reuse)."""
    device = torch.device(device)
    if device.type == "cuda":
        idle = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return torch.cuda.mem_get_info(device)[0] + idle
    return meminfo_bytes("MemAvailable")[0]


def meminfo_bytes(*keys: str) -> list[int]:
    """The named entries of Linux's /proc/meminfo, in bytes."""
    with open("/proc/meminfo") as f:
        info = dict(line.split(":", 1) for line in f)
    return [int(info[k].split()[0]) * 1024 for k in keys]


class KVCache:
    def __init__(self, config: ModelConfig, batch: int, max_len: int, dtype=torch.float32, device="cpu"):
        if batch <= 0 or max_len <= 0:
            raise ValueError(f"KV cache needs batch >= 1 and max_len >= 1, got {batch}, {max_len}")
        heads, k_dim, v_dim = config.cache_dims
        self.k = torch.zeros((config.num_layers, batch, heads, max_len, k_dim), dtype=dtype, device=device)
        self.v = torch.zeros((config.num_layers, batch, heads, max_len, v_dim), dtype=dtype, device=device)
        self.max_len = max_len

    def rows(self, start: int, stop: int) -> "KVCache":
        """Sequences start..stop-1 as a cache of their own (a view: writes land in this cache)."""
        view = object.__new__(KVCache)
        view.k, view.v, view.max_len = self.k[:, start:stop], self.v[:, start:stop], self.max_len
        return view

    def move(self, src: int, dst: int, length: int) -> None:
        """Copy the first `length` slots of sequence src to sequence dst (all layers)."""
        self.k[:, dst, :, :length] = self.k[:, src, :, :length]
        self.v[:, dst, :, :length] = self.v[:, src, :, :length]

    def keep_path(self, row: int, prefix: int, path: list[int]) -> None:
        """After a verify that wrote tree nodes 0..n-1 of sequence `row` to slots prefix..prefix+n-1: keep
        only the accepted `path` (node indices, root first), in order, in slots prefix..prefix+len(path)-1.
        The slots after it are free for the next round. Nodes already in their slot (path[j] == j: always
        the root, and a whole chain) are not copied."""
        moved = next((j for j, node in enumerate(path) if node != j), len(path))
        if moved == len(path):
            return
        src = torch.tensor(path[moved:]).to(self.k.device, non_blocking=True) + prefix
        for kv in (self.k, self.v):
            kv[:, row, :, prefix + moved:prefix + len(path)] = kv[:, row, :, src]

    @staticmethod
    def slot_range(slots: torch.Tensor) -> torch.Tensor | int:
        """slots [1, T] on the host that run start..start+T-1 -> start, which `write` stores with one plain
        copy instead of an indexed scatter (fewer, cheaper ops in a CPU decode step); else unchanged.
        Device slots stay tensors: reading them would sync (and break CUDA-graph capture)."""
        if slots.device.type != "cpu" or slots.shape[0] != 1:
            return slots
        start, T = int(slots[0, 0]), slots.shape[1]
        return start if T == 1 or torch.equal(slots[0], torch.arange(start, start + T)) else slots

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor | int) -> None:
        """k/v [B, Hkv, T, D] go to slots [B, T] of sequences 0..B-1, or to start..start+T-1 (slots an int)."""
        if isinstance(slots, int):
            T = k.shape[2]
            self.k[layer, :k.shape[0], :, slots:slots + T] = k
            self.v[layer, :v.shape[0], :, slots:slots + T] = v
            return
        rows = torch.arange(k.shape[0], device=k.device)[:, None]          # [B, 1]
        self.k[layer][rows, :, slots] = k.transpose(1, 2).to(self.k.dtype)  # indexed view: [B, T, Hkv, D]
        self.v[layer][rows, :, slots] = v.transpose(1, 2).to(self.v.dtype)
