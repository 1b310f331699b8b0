"""The forwards a speculative round makes, each through the fastest path the engine has: replayed CUDA graphs
per (batch, tokens) bucket (graphs.py), one sequence's torch.compile'd CPU step (compiled_decode.py), or eager.
The engine (engine.py) decides what runs; the runner owns the KV caches and runs it.

Running sequence i lives in row i of both caches (the target's and the draft head's). The caches are
allocated once: max_len slots per row, plus room for one round's tree nodes (and a lookup branch's) past a
sequence's end, plus one never-attended scratch slot where graphs send their padding.
"""
from __future__ import annotations

import torch

from toolkit.infer.drafts import Eagle3Head
from toolkit.infer.kv_cache import KVCache
from toolkit.infer.model import Transformer
from toolkit.infer.tree import Tree, TreeConfig, draft_trees


class Runner:
    def __init__(self, target: Transformer, head: Eagle3Head | None, tree: TreeConfig, extra: int, max_len: int,
                 max_batch: int, cuda_graphs: bool | None = None, graph_capture=None, compile: bool = False,
                 sample_draft: bool = False, spare_rows: int = 0, draft_graphs: bool = True):
        """extra: the most nodes a lookup branch adds to a round (0 without lookup). cuda_graphs (default: on
        for a CUDA target) replays the verify / decode step and the draft step from graphs; False is eager.
        draft_graphs False: the draft runs eagerly while the target's steps replay graphs (vLLM's enforce_eager in
        its speculative config).
        graph_capture: how graphs are captured (default torch.cuda.graph; tests pass eager_capture).
        compile: on CPU, one sequence's decode / verify step runs torch.compile'd. spare_rows: cache rows after
        the running batch's, where the prefix cache keeps finished sequences' KV (prefix_cache.py)."""
        self.target, self.head, self.tree, self.extra = target, head, tree, extra
        self.max_batch, self.sample_draft, self.draft_graphs_on = max_batch, sample_draft, draft_graphs
        dtype, self.device = target.embed_tokens.weight.dtype, target.embed_tokens.weight.device
        # a MoE target's routing reads the experts hit on the host, so it runs eagerly; a dense draft is graphed
        graphs = self.device.type == "cuda" if cuda_graphs is None else cuda_graphs
        scratch = int(graphs)  # graphs send padding to one extra, never-attended cache slot
        rows = max_batch + spare_rows  # the running batch reads rows :B; spare rows are only copied from and to
        self.cache = KVCache(target.config, rows, max_len + tree.num_draft_tokens + extra + scratch, dtype,
                             self.device)
        self.draft_cache, self.aux_layers = None, head.aux_layers if head is not None else ()
        if head is not None:
            spare = tree.num_steps * tree.topk + 1 + extra
            self.draft_cache = head.new_cache(max_len + spare + scratch, dtype, self.device, rows)
        self.target_graphs = self.draft_graphs = self.draft_loop = None
        if graphs:
            self._capture(graph_capture)
        self.compiled = None
        if compile:
            from toolkit.infer.compiled_decode import CompiledDecode

            if self.device.type != "cpu":
                raise ValueError("compile=True is the CPU decode path; on a GPU the engine replays CUDA graphs")
            self.compiled = CompiledDecode(target, self.cache, self.aux_layers, max_len=max_len)

    def widest(self) -> int:
        """The most nodes one verify step holds: the head's tree (or the root alone) plus a full lookup branch."""
        return (self.tree.num_draft_tokens if self.head is not None else 1) + self.extra

    @torch.no_grad()
    def _capture(self, capture) -> None:
        """Graphs for every batch bucket: the target at 1 token (plain decoding), num_draft_tokens (verify) and
        the widest round (not a MoE target: Transformer.graphable), and for a dense head (DraftHead.graphable) the
        whole draft loop (tree.grow) and the draft extending over what was accepted (1..num_steps + 1 tokens over
        the target's features)."""
        from toolkit.infer.graphs import GraphedDraftLoop, batch_buckets, graph_draft, graph_target

        sizes, t = batch_buckets(self.max_batch), self.tree
        counts = {1, t.num_draft_tokens, self.widest()}  # a lookup branch's nodes are verified too
        if self.target.graphable:
            self.target_graphs = graph_target(self.target, self.cache, self.aux_layers, sizes, sorted(counts), capture)
        if self.head is not None and self.head.graphable and self.draft_graphs_on:
            width = len(self.aux_layers) * self.target.config.hidden_size
            self.draft_graphs = graph_draft(self.head, self.draft_cache, width, sizes, list(range(1, t.num_steps + 2)),
                                            capture)
            self.draft_loop = GraphedDraftLoop(self.head, self.target.embed_tokens, self.draft_cache, t, sizes, capture,
                                               sample=self.sample_draft)

    def warm_up(self) -> None:
        """Compile every step shape the rounds take (plain decoding, a short chain, the widest round), so that no
        compile lands inside a timed run or a served request. A no-op unless compile=True."""
        if self.compiled is None:
            return
        from toolkit.infer.compiled_decode import FEW

        widest = self.widest()
        self.compiled.warm_up([1, min(widest, FEW), widest])

    def host(self, data) -> torch.Tensor:
        """Host data (a list or a CPU tensor) on the engine's device without stopping the host: a blocking
        copy to a GPU first waits for all queued work, which would idle the GPU while the host catches up."""
        return torch.as_tensor(data).to(self.device, non_blocking=True)

    def move(self, old: int, new: int, length: int) -> None:
        """A running sequence's first `length` slots from row old to row new, in both caches."""
        self.cache.move(old, new, length)
        if self.draft_cache is not None:
            self.draft_cache.move(old, new, length)

    def prefill(self, ids: torch.Tensor, row0: int, last: torch.Tensor, aux_layers, start: int = 0):
        """Prompts ids [b, T] (right-padded) into cache rows row0..row0+b-1 from position `start` (a prefix cache
        hit: slots before it hold the prompt's first tokens already) -> (logits at `last` [b, 1, V], aux hidden
        states [b, T, H] per aux layer)."""
        positions = None if start == 0 else (start + torch.arange(ids.shape[1], device=ids.device)).expand(
            len(ids), -1)  # the rest attends over the copied slots, causal by position
        return self.target(ids, positions, cache=self.cache.rows(row0, row0 + len(ids)), logits_at=last,
                           aux_layers=aux_layers)

    def verify(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor):
        """The target over the running rows' round nodes tokens/positions/slots [B, n] (mask [B, n, S]) ->
        (logits [B, n, V], aux hidden states [B, n, H] per aux layer)."""
        out = None if self.target_graphs is None else self.target_graphs(
            tokens=tokens, positions=positions, slots=slots, mask=mask)
        if out is not None:
            logits, *aux = out
            return logits, aux
        batch, n = tokens.shape
        if self.compiled is not None and batch == 1:  # one sequence's step, compiled
            return self.compiled(tokens, positions, slots, None if n == 1 else mask)
        if n == 1 and batch == 1:  # plain decoding of one sequence: it sees every slot, no mask needed
            mask = None
        return self.target(tokens, positions, cache=self.cache, slots=slots, mask=mask, aux_layers=self.aux_layers)

    def grow(self, prefix: list[int], roots: list[int], root_out, root_logp, sampled: dict) -> list[Tree]:
        """Each running sequence's draft tree from its root (the draft loop's graph when one holds the batch)."""
        grown = None if self.draft_loop is None else self.draft_loop(
            self.host(prefix), self.host(roots), root_out, root_logp, **sampled)
        if grown is not None:
            return [Tree(*parts) for parts in zip(*grown)]
        return draft_trees(self.head, self.target.embed_tokens, self.draft_cache, prefix, roots, root_out, root_logp,
                           self.tree, **sampled)

    def _draft(self, emb, hidden, positions, slots, mask):
        """The head over the draft cache's rows 0..B-1, replayed from a graph when one holds the shape."""
        out = None if self.draft_graphs is None else self.draft_graphs(
            emb=emb, hidden=hidden, positions=positions, slots=slots, mask=mask)
        return out if out is not None else self.head(emb, hidden, positions, self.draft_cache, slots=slots,
                                                     mask=mask)

    def extend(self, seqs: list, tokens: torch.Tensor, hidden: torch.Tensor, start: list[int], row0: int) -> None:
        """Write draft pairs for positions start[b]..prefix-1 of the sequences in rows row0.. (tokens/hidden
        right-padded) and keep each one's output at prefix-1: the draft's prediction after its root."""
        width, m = tokens.shape[1], len(seqs)
        pos = self.host([[st + j for j in range(width)] for st in start])
        emb = self.target.embed_tokens(tokens)
        if getattr(self.head, "blank_position0", False) and 0 in start:  # MTP: pair 0 reads a zero embedding
            emb[[b for b, st in enumerate(start) if st == 0], 0] = 0
        if row0 == 0:  # the running rows (a step): causal by position, through the graphs when on
            mask = torch.arange(max(start) + width, device=self.device)[None, None, :] <= pos[:, :, None]
            logp, out = self._draft(emb, hidden, pos, pos, mask)
        else:  # rows being admitted (a prefill)
            cache = None if self.draft_cache is None else self.draft_cache.rows(row0, row0 + m)
            logp, out = self.head(emb, hidden, pos, cache)
        for b, (s, st) in enumerate(zip(seqs, start)):
            last = max(s.prefix - st - 1, 0)  # s.prefix is already the new end
            s.root_logp, s.root_out = logp[b, last].clone(), out[b, last].clone()  # not views of the batch
