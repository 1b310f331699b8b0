"""One sequence's target step (a plain decode token, or the chain / tree a verify round checks), compiled
with torch.compile (inductor's C++ code on CPU).

Why: on a CPU a SmolLM2-sized step is ~40 small ops per layer (norms, RoPE, cache writes, the residual
adds, SiLU), each costing a few microseconds of dispatch; together they are a third of a decode step.
Inductor fuses them into a handful of C++ loops and keeps the GEMMs as BLAS calls. CUDA graphs do this job
on a GPU (graphs.py); this is the CPU's counterpart for one running sequence (the engine's `compile=True`,
`toolkit bench/serve --compile`). Compiling takes two to three minutes per step shape (1 token, the verify
tokens) once per process; inductor caches its code on disk, so later processes start faster.

The step is the target's forward (model.py) for B = 1 with the token count and the attended slot count
symbolic: one graph serves every position, and two serve the token counts (up to FEW, and past it). Each
layer's key/value cache is passed in as its own tensor: a write into one big cache tensor would be copied
whole by the compiled graph.
"""
from __future__ import annotations

import os
import shutil

import torch
import torch.nn.functional as F

from toolkit.infer.attention import attention_masks, rope_cos_sin, rotate
from toolkit.infer.kv_cache import KVCache
from toolkit.infer.model import Transformer, refuse_unlike_llama


FEW = 4  # the most tokens the small-step graph takes; longer steps go to the other (see CompiledDecode)


def cpp_compiler() -> str | None:
    """The C++ compiler inductor would use ($CXX, else g++ / clang++ on PATH), or None."""
    found = (shutil.which(c) for c in (os.environ.get("CXX"), "g++", "clang++") if c)
    return next((path for path in found if path), None)


def decode_step(target: Transformer, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                kv_len: int, bias: torch.Tensor | None, keys: list[torch.Tensor], values: list[torch.Tensor],
                aux_layers: tuple[int, ...] = ()):
    """tokens/positions [1, T] written to cache slots [T]; kv_len = S, the slots attended (past the last
    written); bias: additive mask [1, 1, T, S], or None when T == 1 (the token sees every slot up to its
    own); keys/values: each layer's cache row [1, Hkv, max_len, D]. Returns (logits [1, T, V], [aux hidden
    [1, T, H]] per aux layer: a layer's output, or -1 for the final normed state, as Transformer.forward)."""
    c = target.config
    T, S = tokens.shape[1], kv_len
    h = target.embed_tokens(tokens)                                                         # [1, T, H]
    cos, sin = rope_cos_sin(positions, target.inv_freq, h.dtype, c.rope_attention_factor())  # [1, 1, T, D]
    kept = [h] * len(aux_layers)                                     # filled in below, in aux_layers' order
    for i, layer in enumerate(target.layers):
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        q, k, v = attn.qkv_proj(x)
        q = q.view(1, T, c.num_heads, c.head_dim)
        k = k.view(1, T, c.num_kv_heads, c.head_dim)
        if c.qk_norm:
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = rotate(q.transpose(1, 2), cos, sin), rotate(k.transpose(1, 2), cos, sin)   # [1, h, T, D]
        v = v.view(1, T, c.num_kv_heads, c.head_dim).transpose(1, 2)                       # [1, Hkv, T, D]
        keys[i].index_copy_(2, slots, k)
        values[i].index_copy_(2, slots, v)
        a = F.scaled_dot_product_attention(q, keys[i][:, :, :S], values[i][:, :, :S], attn_mask=bias,
                                           enable_gqa=c.num_heads != c.num_kv_heads)        # [1, Hq, T, D]
        a = attn.o_proj(a.transpose(1, 2).reshape(1, T, c.num_heads * c.head_dim))
        h, x = layer.post_attention_layernorm(a, residual=h)
        h = h + layer.mlp(x)
        kept = [h if lid == i else old for lid, old in zip(aux_layers, kept)]
    normed = target.norm(h)                                          # aux id -1 (EAGLE-1/2 heads read it)
    return target.readout(normed), [normed if lid == -1 else old for lid, old in zip(aux_layers, kept)]


class CompiledDecode:
    """decode_step under torch.compile, bound to row 0 of a cache: one sequence's plain decode step and its
    verify step (a chain or a tree of T tokens in contiguous slots)."""

    def __init__(self, target: Transformer, cache: KVCache, aux_layers=(), autotune: bool = True,
                 max_len: int | None = None):
        """max_len: the longest sequence the engine admits (default: the cache's length); the slots past it hold
        a last round's draft nodes, whose outputs past max_len are never read."""
        c = target.config
        refuse_unlike_llama(c, "the compiled decode step (--compile)")
        if c.mla is not None or c.moe is not None:
            raise ValueError("the compiled decode step covers dense Llama-family targets (not MLA / MoE)")
        longest = cache.max_len if max_len is None else max_len
        if c.sliding_window is not None and longest > c.sliding_window:
            raise ValueError(f"the compiled decode step attends over the whole sequence, and this target slides a "
                             f"window of {c.sliding_window} over a longer one ({longest} tokens): run without "
                             "--compile, or with sequences no longer than the window (bench --max-len, serve "
                             f"--max-seq-len {c.sliding_window})")
        if not cpp_compiler():
            raise ValueError("compile=True (--compile) needs a C++ compiler for torch.compile's CPU code: none "
                             "found (set CXX, or install g++ / clang++); run without --compile instead")
        self.keys = [cache.k[i, :1] for i in range(c.num_layers)]      # views: writes land in the cache
        self.values = [cache.v[i, :1] for i in range(c.num_layers)]
        # the cache's sizes are constants: left dynamic, a step as wide as the KV heads made dynamo give both one
        # symbol, the heads' view pinned it, and the next width compiled again mid-request (guards sit on the
        # views' base, so it is marked too)
        for x in (cache.k, cache.v, *self.keys, *self.values):
            torch._dynamo.mark_static(x)
        aux = tuple(aux_layers)

        # Two compiled functions (two code objects, so two dynamo caches): one for 1..FEW tokens (plain decoding,
        # short chains), one for longer verify steps. Inductor autotunes its C++ GEMMs once, at the shape of
        # the first call, and keeps them for every later size of the symbolic token count; GEMMs picked at 2-4
        # rows cost twice as much from 5 rows on (SmolLM2, 1 thread: 8 tokens 47 ms against 30, 16 tokens 66
        # against 42; RESULTS.md), while GEMMs picked at 6-32 rows cost 10-15% more at 2-4 rows.
        def few(tokens, positions, slots, kv_len, bias, keys, values):  # target, aux: constants of the graph
            return decode_step(target, tokens, positions, slots, kv_len, bias, keys, values, aux)

        def many(tokens, positions, slots, kv_len, bias, keys, values):
            return decode_step(target, tokens, positions, slots, kv_len, bias, keys, values, aux)

        # dynamic: the slot and token counts stay symbolic. max-autotune times inductor's own C++ GEMM kernels
        # against MKL's per shape and keeps the faster; freezing lets it pre-pack the (constant) weights. On
        # the 2-core AMD box MKL's few-row GEMMs run at ~12 GFLOP/s; with the C++ ones SmolLM2's 6-token verify
        # step takes 100 ms instead of 185 ms eager (RESULTS.md), and the 1-token step 43 instead of 66 ms.
        self.options = {"max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN", "freezing": True,
                        "autotune_num_choices_displayed": 0} if autotune else {}
        self.few, self.many = torch.compile(few, dynamic=True), torch.compile(many, dynamic=True)

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor | None):
        """tokens/positions/slots [1, T] on the host; mask bool [1, T, S] over the first S slots, or None for
        one token that sees every slot up to its own -> (logits [1, T, V], aux list)."""
        from torch._inductor import config

        bias = None if mask is None else attention_masks(mask, self.keys[0].dtype)[0]
        kv_len = int(slots[0, -1]) + 1 if mask is None else mask.shape[-1]
        step = self.few if tokens.shape[1] <= FEW else self.many
        with config.patch(self.options):  # inductor reads them when a call compiles (torch.compile's
            return step(tokens, positions, slots[0], kv_len, bias, self.keys, self.values)  # options= did not)

    @torch.no_grad()
    def warm_up(self, widths: list[int]) -> None:
        """Run one step of each width in `widths` (token counts) on dummy tokens, so that each graph those
        steps take is compiled now (a graph's first call compiles it, a minute or two on SmolLM2) and its
        GEMMs are picked at that width. Writes go to the cache's last slots: call it with no sequence in
        the cache."""
        cap, dev = self.keys[0].shape[2], self.keys[0].device
        for n in sorted(set(widths)):
            start = cap - n - 1  # kv_len = cap - 1: no slot count the graphs could specialize on
            if start < 1:
                raise ValueError(f"a {n}-token step does not fit a {cap}-slot cache")
            # fresh tensors, as the engine passes: dynamo guards on views (their base) and on aliasing
            slots = torch.arange(start, start + n, device=dev).reshape(1, n).clone()
            mask = None if n == 1 else torch.arange(start + n, device=dev)[None, None, :] <= slots[:, :, None]
            self(torch.zeros_like(slots), slots.clone(), slots, mask)
