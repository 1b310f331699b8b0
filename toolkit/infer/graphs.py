"""CUDA graphs for the engine's fixed-shape forwards (the target's decode / verify step and the draft head's
step), one graph per (batch, tokens) bucket, as SGLang and vLLM capture them.

A graph replays fixed shapes and fixed memory, so each bucket owns static input buffers: a call copies its
inputs into the leading corner of the smallest bucket that holds them, replays, and returns the outputs'
leading [B, T] corner. The forward attends over the whole KV cache (kv_len = every slot, so no shape depends
on the sequence length) with the caller's mask zero-padded on the right. Padding entries (rows past B,
tokens past T) write their key/value to a scratch slot (the cache's last) that no real mask includes, and attend
to slot 0 alone: never nothing (an all-masked row would be NaN, and a NaN value in the cache poisons every query
that multiplies it by a zero weight), and not the scratch slot either: the Triton attention reads each row's
slots up to the last one any of its tokens sees (tree_attention's `lens`), so a padding entry that saw the last
slot made its row read the whole cache (a verify padded to a wider bucket, a batch of 3 in the bucket of 4: in
an engine with a 32k-slot cache, 32k slots per layer for that row instead of its sequence's). Slot 0 is the
sequence's first token for a real row, and a free row's own for a padding row (running sequence i is in row i).

`capture` is torch.cuda.graph on a GPU; `eager_capture` runs the same buffers without a graph, so the
bucketing, padding and scratch-slot logic is tested on CPU (tests/infer/test_graphs.py) and the CUDA-only
test compares graph replays with eager forwards.
"""
from __future__ import annotations

from typing import Callable

import torch

Forward = Callable[..., tuple]  # fn(**inputs) -> tuple of tensors [B, T, ...]


def cuda_capture(fn: Forward, static: dict, pool) -> tuple[Callable[[], None], tuple]:
    """Warm up on a side stream (as torch requires before capture), then capture one call of fn."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn(**static)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn(**static)
    return graph.replay, out


def eager_capture(fn: Forward, static: dict, pool=None) -> tuple[Callable[[], None], tuple]:
    """The same contract without a graph: replay re-runs fn on the static buffers into the same outputs."""
    out = fn(**static)

    def replay() -> None:
        for dst, src in zip(out, fn(**static)):
            dst.copy_(src)

    return replay, out


def batch_buckets(max_batch: int) -> list[int]:
    """1, 2, 4, ... up to max_batch (always included)."""
    sizes, b = [], 1
    while b < max_batch:
        sizes.append(b)
        b *= 2
    return sizes + [max_batch]


class GraphedForward:
    def __init__(self, fn: Forward, example: dict[str, torch.Tensor], buckets: list[tuple[int, int]],
                 scratch: int, mask_len: int, capture=None):
        """fn(**inputs) must take `slots` [B, T] and `mask` bool [B, T, mask_len] among its inputs; `example`
        gives each other input's dtype, device and trailing dims (its first two dims are ignored). `scratch`
        is the cache slot padding writes to. Buckets are (batch, tokens) pairs, captured largest first so
        smaller graphs reuse the shared memory pool."""
        if not buckets:
            raise ValueError("CUDA graphs need at least one (batch, tokens) bucket")
        if not 0 <= scratch < mask_len:
            raise ValueError(f"scratch slot {scratch} outside the {mask_len} cache slots")
        if capture is None:
            capture = cuda_capture
        self.scratch, self.mask_len = scratch, mask_len
        self.buckets = sorted(set(buckets))
        pool = torch.cuda.graph_pool_handle() if capture is cuda_capture else None
        self.graphs = {}
        for b, t in reversed(self.buckets):
            static = {k: torch.zeros((b, t, *v.shape[2:]), dtype=v.dtype, device=v.device)
                      for k, v in example.items() if k not in ("slots", "mask")}
            device = next(iter(example.values())).device
            static["slots"] = torch.full((b, t), scratch, dtype=torch.long, device=device)
            static["mask"] = torch.zeros(b, t, mask_len, dtype=torch.bool, device=device)
            static["mask"][..., scratch] = True  # the capture's own writes go to the scratch slot
            replay, out = capture(fn, static, pool)
            self.graphs[(b, t)] = (static, replay, out)

    def bucket(self, batch: int, tokens: int) -> tuple[int, int] | None:
        """The smallest captured bucket holding (batch, tokens), or None (the caller runs eagerly)."""
        return next(((b, t) for b, t in self.buckets if b >= batch and t >= tokens), None)

    def __call__(self, **inputs: torch.Tensor) -> tuple | None:
        """Inputs [B, T, ...] (mask [B, T, S] with S <= mask_len) -> outputs [B, T, ...], or None when no
        bucket holds (B, T)."""
        B, T = inputs["slots"].shape
        S = inputs["mask"].shape[-1]
        if S > self.mask_len:
            raise ValueError(f"mask over {S} slots; the graphs attend over {self.mask_len}")
        key = self.bucket(B, T)
        if key is None:
            return None
        static, replay, out = self.graphs[key]
        for name, x in inputs.items():
            if name not in static:
                raise ValueError(f"input {name!r} was not captured; captured: {sorted(static)}")
            if name != "mask":
                static[name][:B, :T].copy_(x)
        static["slots"][B:] = self.scratch
        static["slots"][:, T:] = self.scratch
        if "positions" in static:  # padding at position 0 (a larger call's positions left there put its query past
            static["positions"][B:] = 0  # a sliding window's reach of slot 0: no visible slot, NaN on eager paths)
            static["positions"][:, T:] = 0
        mask = static["mask"]
        mask.zero_()
        mask[:B, :T, :S] = inputs["mask"]
        mask[B:, :, 0] = True  # padding attends slot 0: the rows' attention bounds stay their sequences'
        mask[:, T:, 0] = True
        replay()
        return tuple(o[:B, :T].clone() for o in out)  # the buffers are overwritten by the next replay


def graph_target(target, cache, aux_layers, batch_sizes: list[int], token_counts: list[int],
                 capture=None) -> GraphedForward:
    """The target's forward over `cache` (whose last slot is scratch): inputs tokens/positions/slots [B, T]
    and mask [B, T, S]; outputs (logits [B, T, V], *aux hidden [B, T, H])."""
    S, device = cache.max_len, cache.k.device

    def fn(tokens, positions, slots, mask):
        logits, aux = target(tokens, positions, cache=cache, slots=slots, mask=mask, aux_layers=aux_layers,
                             kv_len=S)
        return (logits, *aux)

    ids = torch.zeros(1, 1, dtype=torch.long, device=device)
    return GraphedForward(fn, {"tokens": ids, "positions": ids}, [(b, t) for b in batch_sizes for t in token_counts],
                          scratch=S - 1, mask_len=S, capture=capture)


def graph_draft(head, cache, hidden_width: int, batch_sizes: list[int], token_counts: list[int],
                capture=None) -> GraphedForward:
    """The draft head's forward over `cache` (last slot scratch): inputs emb [B, T, H], hidden
    [B, T, hidden_width], positions/slots [B, T], mask [B, T, S]; outputs (log-probs [B, T, N], hidden)."""
    S, device, dtype = cache.max_len, cache.k.device, cache.k.dtype

    def fn(emb, hidden, positions, slots, mask):
        return head(emb, hidden, positions, cache, slots=slots, mask=mask, kv_len=S)

    example = {"emb": torch.zeros(1, 1, head.config.hidden_size, dtype=dtype, device=device),
               "hidden": torch.zeros(1, 1, hidden_width, dtype=dtype, device=device),
               "positions": torch.zeros(1, 1, dtype=torch.long, device=device)}
    return GraphedForward(fn, example, [(b, t) for b in batch_sizes for t in token_counts],
                          scratch=S - 1, mask_len=S, capture=capture)


class GraphedDraftLoop:
    """The whole draft loop (tree.grow: num_steps head forwards and the tree bookkeeping, all on the device)
    replayed from one graph per batch bucket. Padding rows draft for prefix 1 in their own (free) rows."""

    def __init__(self, head, embed, cache, cfg, batch_sizes: list[int], capture=None, sample: bool = False):
        """sample: a sampled chain (tree.grow's gumbel / inv_temp become inputs, its log-probs an output)."""
        from toolkit.infer.tree import grow

        if capture is None:
            capture = cuda_capture
        S, device, dtype = cache.max_len, cache.k.device, cache.k.dtype

        def fn(prefix, roots, root_out, root_logp, gumbel=None, inv_temp=None):
            def forward(emb, hidden, positions, slots, mask, **kw):  # kw: log_probs, pre (DraftHead.forward)
                return head(emb, hidden, positions, cache, slots=slots, mask=mask, kv_len=S, **kw)

            return grow(head, embed, forward, prefix, roots, root_out, root_logp, cfg, mask_len=S, gumbel=gumbel,
                        inv_temp=inv_temp)

        pool = torch.cuda.graph_pool_handle() if capture is cuda_capture else None
        self.sizes, self.graphs = sorted(set(batch_sizes)), {}
        for b in reversed(self.sizes):
            static = {"prefix": torch.ones(b, dtype=torch.long, device=device),
                      "roots": torch.zeros(b, dtype=torch.long, device=device),
                      "root_out": torch.zeros(b, head.config.hidden_size, dtype=dtype, device=device),
                      "root_logp": torch.zeros(b, len(head.d2t), dtype=torch.float32, device=device)}
            if sample:
                static["gumbel"] = torch.zeros(b, cfg.num_steps, len(head.d2t), dtype=torch.float32, device=device)
                static["inv_temp"] = torch.ones(b, dtype=torch.float32, device=device)
            replay, out = capture(fn, static, pool)
            self.graphs[b] = (static, replay, out)

    def __call__(self, prefix: torch.Tensor, roots: torch.Tensor, root_out: torch.Tensor, root_logp: torch.Tensor,
                 **sampled) -> tuple | None:
        """prefix/roots [B], root_out [B, H], root_logp [B, N] -> (tokens, parents, depth) [B, n], or None when
        B exceeds every bucket. A sampled loop also takes gumbel and inv_temp and returns the log-probs."""
        B = len(prefix)
        b = next((s for s in self.sizes if s >= B), None)
        if b is None:
            return None
        static, replay, out = self.graphs[b]
        for name, x in (("prefix", prefix), ("roots", roots), ("root_out", root_out), ("root_logp", root_logp),
                        *sampled.items()):
            if name not in static:
                raise ValueError(f"input {name!r} was not captured; captured: {sorted(static)}")
            static[name][:B].copy_(x)
        static["prefix"][B:] = 1
        replay()
        return tuple(o[:B].clone() for o in out)
