"""The speculative step loop over a batch of sequences of different lengths: prefill, then rounds of draft
trees -> one target verify forward for the whole batch -> accept a path per sequence -> compact each
sequence's KV cache -> extend the draft over what was accepted.

Without a draft head every round verifies the root alone, which is plain decoding with the same code.
Sequences are right-padded where lengths differ: a pad writes to cache slots past its sequence's end, which
no mask lets anyone read and which the next round overwrites.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from toolkit.infer.drafts import Eagle3Head
from toolkit.infer.kv_cache import KVCache, free_memory_bytes, max_len_for_memory
from toolkit.infer.model import Transformer
from toolkit.infer.sampling import SamplingParams, target_probs
from toolkit.infer.tree import Tree, TreeConfig, draft_trees
from toolkit.infer.verify import greedy_verify, sample_verify


@dataclass
class Result:
    tokens: list[int]                   # generated ids (prompt excluded), stops included
    verify_steps: int = 0               # target forwards after prefill
    accepted: list[int] = field(default_factory=list)  # draft tokens accepted per verify step
    seconds: dict = field(default_factory=lambda: {"prefill": 0.0, "draft": 0.0, "verify": 0.0})
    category: str = "all"               # the caller's label (bench groups τ by it)

    @property
    def tau(self) -> float:
        """Tokens per verify step, the bonus token included (accepted + 1)."""
        return (sum(self.accepted) + len(self.accepted)) / max(len(self.accepted), 1)


class StopStrings:
    """True once the decoded generation contains one of `strings` (checked on a tail of tokens, so the cost
    per token stays constant). Generation stops at the token that completes the string, as plain decoding
    does; callers cut the text at the string."""

    def __init__(self, tokenizer, strings: list[str]):
        if not strings or any(not s for s in strings):
            raise ValueError("stop strings must be non-empty")
        self.tok, self.strings = tokenizer, list(strings)
        self.tail = max(len(s) for s in strings) + 8  # tokens: each covers at least one character

    def __call__(self, tokens: list[int]) -> bool:
        # called after every new token, so a string found now was completed by the newest token
        text = self.tok.decode(tokens[-self.tail:])
        return any(s in text for s in self.strings)


def _pad(rows: list[list], value) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [value] * (width - len(r)) for r in rows])


class Engine:
    def __init__(self, target: Transformer, head: Eagle3Head | None = None, tree: TreeConfig | None = None,
                 max_len: int | None = 2048, max_batch: int = 1, memory_fraction: float = 0.3):
        """max_len None: size the KV cache from free memory (memory_fraction of it), capped by the
        target's max_position_embeddings."""
        self.target, self.head = target, head
        self.tree = tree or TreeConfig(num_steps=1, topk=1, num_draft_tokens=2)
        if head is not None and self.tree.topk > len(head.d2t):
            raise ValueError(f"--topk {self.tree.topk} exceeds the draft vocabulary ({len(head.d2t)})")
        dtype, self.device = target.embed_tokens.weight.dtype, target.embed_tokens.weight.device
        if max_len is None:
            budget = int(free_memory_bytes(self.device) * memory_fraction)
            max_len = min(max_len_for_memory(target.config, budget, max_batch, dtype),
                          target.config.max_position_embeddings)
        if max_len < 2:
            raise ValueError(f"KV cache of {max_len} slots is too small: lower the batch or free memory")
        self.max_len, self.max_batch = max_len, max_batch
        self.cache = KVCache(target.config, max_batch, max_len + self.tree.num_draft_tokens, dtype, self.device)
        if head is not None:
            spare = self.tree.num_steps * self.tree.topk + 1
            self.draft_cache = head.new_cache(max_len + spare, dtype, self.device, max_batch)

    def generate(self, prompt: list[int], params: SamplingParams, stop_ids=frozenset(), generator=None,
                 stop_strings: "StopStrings | None" = None) -> Result:
        return self.generate_batch([prompt], params, stop_ids, generator, stop_strings)[0]

    @torch.no_grad()
    def generate_batch(self, prompts: list[list[int]], params: SamplingParams, stop_ids=frozenset(),
                       generator: torch.Generator | None = None, stop_strings: "StopStrings | None" = None
                       ) -> list[Result]:
        B = len(prompts)
        if not 1 <= B <= self.max_batch:
            raise ValueError(f"batch of {B} prompts; this engine takes 1..{self.max_batch}")
        for p in prompts:
            if not p:
                raise ValueError("a prompt is empty")
            if len(p) + params.max_new_tokens > self.max_len:
                raise ValueError(f"prompt ({len(p)} tokens) + max_new_tokens ({params.max_new_tokens}) exceeds "
                                 f"the engine's max length {self.max_len}")
        aux_layers = self.head.aux_layers if self.head is not None else ()
        res, t0 = [Result([]) for _ in prompts], time.perf_counter()
        prefix = [len(p) for p in prompts]
        ids = _pad(prompts, 0).to(self.device)
        logits, aux = self.target(ids, cache=self.cache, aux_layers=aux_layers)   # positions 0..len-1
        roots = [self._pick(logits[b, prefix[b] - 1], params, generator) for b in range(B)]
        for r, root in zip(res, roots):
            r.tokens.append(root)
        if self.head is not None:  # draft pairs (token t+1, target hidden t) for t = 0..len-1
            nxt = _pad([p[1:] + [root] for p, root in zip(prompts, roots)], 0).to(self.device)
            self._draft_extend(nxt, torch.cat(aux, -1), [0] * B, prefix)
        for r in res:
            r.seconds["prefill"] = (time.perf_counter() - t0) / B
        stops = lambda toks: toks[-1] in stop_ids or len(toks) >= params.max_new_tokens or (  # noqa: E731
            stop_strings is not None and stop_strings(toks))
        done = [stops(r.tokens) for r in res]
        while not all(done):
            t1 = time.perf_counter()
            if self.head is not None:
                trees = draft_trees(self.head, self.target.embed_tokens, self.draft_cache, prefix, roots,
                                    self.root_out, self.root_logp, self.tree)
            else:
                trees = [Tree(torch.tensor([root]), torch.tensor([-1]), torch.tensor([0])) for root in roots]
            t2 = time.perf_counter()
            paths, emitted, aux = self._verify(trees, prefix, params, generator, aux_layers)
            t3 = time.perf_counter()
            grown = [0 if done[b] else len(paths[b]) for b in range(B)]  # finished sequences stay put
            for b in range(B):
                if done[b]:
                    continue
                res[b].verify_steps += 1
                res[b].accepted.append(len(paths[b]) - 1)
                for tok in emitted[b]:  # stop exactly where plain decoding would
                    res[b].tokens.append(tok)
                    if stops(res[b].tokens):
                        done[b] = True
                        break
            roots = [r.tokens[-1] for r in res]
            if self.head is not None and not all(done):
                fused = torch.cat(aux, -1)
                hidden = [fused[b, paths[b]] for b in range(B)]
                width = max(len(h) for h in hidden)
                hidden = torch.stack([torch.cat([h, h[-1:].expand(width - len(h), -1)]) for h in hidden])
                self._draft_extend(_pad(emitted, 0).to(self.device), hidden, prefix,
                                   [p + g for p, g in zip(prefix, grown)])
            prefix = [p + g for p, g in zip(prefix, grown)]
            t4 = time.perf_counter()
            for b in range(B):
                res[b].seconds["draft"] += ((t2 - t1) + (t4 - t3)) / B
                res[b].seconds["verify"] += (t3 - t2) / B
        return res

    def _draft_extend(self, tokens: torch.Tensor, hidden: torch.Tensor, start: list[int], end: list[int]):
        """Write draft pairs for positions start[b]..end[b]-1 (tokens/hidden right-padded) and keep each
        sequence's output at end[b]-1: the draft's prediction after its root."""
        width = tokens.shape[1]
        pos = torch.tensor([[s + j for j in range(width)] for s in start], device=self.device)
        logp, out = self.head(self.target.embed_tokens(tokens), hidden, pos, self.draft_cache)
        last = torch.tensor([max(e - s - 1, 0) for s, e in zip(start, end)], device=self.device)
        rows = torch.arange(len(start), device=self.device)
        self.root_logp, self.root_out = logp[rows, last], out[rows, last]

    def _pick(self, logits, params, generator) -> int:
        if params.greedy:
            return int(logits.argmax())
        return int(torch.multinomial(target_probs(logits, params), 1, generator=generator))

    def _verify(self, trees: list[Tree], prefix: list[int], params, generator, aux_layers):
        """One target forward over every sequence's tree; returns per sequence the accepted path and the
        emitted tokens, and the aux hidden states of the tree nodes. Accepted nodes' KV moves to contiguous
        slots right after the sequence's prefix."""
        n, dev = len(trees[0].tokens), self.device
        slots = torch.tensor([[p + j for j in range(n)] for p in prefix], device=dev)
        mask = torch.zeros(len(trees), n, max(prefix) + n, dtype=torch.bool, device=dev)
        for b, (tree, p) in enumerate(zip(trees, prefix)):
            mask[b, :, :p] = True
            mask[b, :, p:p + n] = tree.ancestor_mask()
        tokens = torch.stack([t.tokens for t in trees]).to(dev)
        positions = torch.stack([p + t.depth for p, t in zip(prefix, trees)]).to(dev)
        logits, aux = self.target(tokens, positions, cache=self.cache, slots=slots, mask=mask,
                                  aux_layers=aux_layers)
        paths, emitted = [], []
        for b, (tree, p) in enumerate(zip(trees, prefix)):
            if params.greedy:
                path, out = greedy_verify(tree.tokens, tree.parents, logits[b])
            else:
                path, out = sample_verify(tree.tokens, tree.parents, target_probs(logits[b], params), generator)
            src = torch.tensor(path, device=dev) + p
            for kv in (self.cache.k, self.cache.v):  # keep only the accepted path, in order
                kv[:, b, :, p:p + len(path)] = kv[:, b, :, src]
            paths.append(path)
            emitted.append(out)
        return paths, emitted, aux
