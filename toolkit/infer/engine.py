"""The speculative step loop (one sequence): prefill, then rounds of draft tree -> one target verify forward
-> accept a path -> compact the target KV cache -> extend the draft over what was accepted.

Without a draft head every round verifies the root alone, which is plain decoding with the same code.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from toolkit.infer.drafts import Eagle3Head
from toolkit.infer.kv_cache import KVCache
from toolkit.infer.model import Transformer
from toolkit.infer.sampling import SamplingParams, target_probs
from toolkit.infer.tree import Tree, TreeConfig, draft_tree
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


class Engine:
    def __init__(self, target: Transformer, head: Eagle3Head | None = None, tree: TreeConfig | None = None,
                 max_len: int = 2048):
        self.target, self.head = target, head
        self.tree = tree or TreeConfig(num_steps=1, topk=1, num_draft_tokens=2)
        if head is not None and self.tree.topk > len(head.d2t):
            raise ValueError(f"--topk {self.tree.topk} exceeds the draft vocabulary ({len(head.d2t)})")
        dtype, device = target.embed_tokens.weight.dtype, target.embed_tokens.weight.device
        self.max_len = max_len
        self.cache = KVCache(target.config, 1, max_len + self.tree.num_draft_tokens, dtype, device)
        if head is not None:
            spare = self.tree.num_steps * self.tree.topk + 1
            self.draft_cache = head.new_cache(max_len + spare, dtype, device)

    @torch.no_grad()
    def generate(self, prompt: list[int], params: SamplingParams, stop_ids: set[int] = frozenset(),
                 generator: torch.Generator | None = None) -> Result:
        if not prompt:
            raise ValueError("the prompt is empty")
        if len(prompt) + params.max_new_tokens > self.max_len:
            raise ValueError(f"prompt ({len(prompt)} tokens) + max_new_tokens ({params.max_new_tokens}) exceeds "
                             f"the engine's max length {self.max_len}")
        device = self.target.embed_tokens.weight.device
        aux_layers = self.head.aux_layers if self.head is not None else ()
        res, t0 = Result([]), time.perf_counter()
        ids = torch.tensor([prompt], device=device)
        logits, aux = self.target(ids, cache=self.cache, aux_layers=aux_layers)   # positions 0..P-1
        root = self._pick(logits[0, -1], params, generator)
        res.tokens.append(root)
        prefix = len(prompt)
        if self.head is not None:  # draft pairs (token t+1, target hidden t) for t = 0..P-1
            nxt = torch.tensor([prompt[1:] + [root]], device=device)
            logp, hout = self.head(self.target.embed_tokens(nxt), torch.cat(aux, -1), ids.new_tensor(
                [list(range(prefix))]), self.draft_cache)
            root_logp, root_out = logp[0, -1], hout[0, -1]
        res.seconds["prefill"] = time.perf_counter() - t0
        while root not in stop_ids and len(res.tokens) < params.max_new_tokens:
            t1 = time.perf_counter()
            if self.head is not None:
                tree = draft_tree(self.head, self.target.embed_tokens, self.draft_cache, prefix, root,
                                  root_out, root_logp, self.tree)
            else:
                tree = Tree(torch.tensor([root]), torch.tensor([-1]), torch.tensor([0]))
            t2 = time.perf_counter()
            path, emitted, aux = self._verify(tree, prefix, params, generator, aux_layers)
            res.verify_steps += 1
            res.accepted.append(len(path) - 1)
            t3 = time.perf_counter()
            for tok in emitted:  # stop exactly where plain decoding would
                res.tokens.append(tok)
                if tok in stop_ids or len(res.tokens) >= params.max_new_tokens:
                    break
            root = res.tokens[-1]  # == emitted[-1] unless a stop cut the round short (then the loop ends)
            if self.head is not None and root not in stop_ids and len(res.tokens) < params.max_new_tokens:
                pos = torch.arange(prefix, prefix + len(path), device=device)[None]
                logp, hout = self.head(self.target.embed_tokens(torch.tensor([emitted], device=device)),
                                       torch.cat(aux, -1)[:, path], pos, self.draft_cache)
                root_logp, root_out = logp[0, -1], hout[0, -1]
            prefix += len(path)
            res.seconds["draft"] += (t2 - t1) + (time.perf_counter() - t3)
            res.seconds["verify"] += t3 - t2
        return res

    def _pick(self, logits, params, generator) -> int:
        if params.greedy:
            return int(logits.argmax())
        return int(torch.multinomial(target_probs(logits, params), 1, generator=generator))

    def _verify(self, tree: Tree, prefix: int, params, generator, aux_layers):
        """One target forward over the tree; returns the accepted path, the emitted tokens and the aux
        hidden states of the tree nodes. The accepted nodes' KV is moved to contiguous slots."""
        n, device = len(tree.tokens), self.cache.k.device
        slots = torch.arange(prefix, prefix + n, device=device)[None]
        mask = torch.ones(1, n, prefix + n, dtype=torch.bool, device=device)
        mask[0, :, prefix:] = tree.ancestor_mask()
        logits, aux = self.target(tree.tokens[None].to(device), (prefix + tree.depth)[None].to(device),
                                  cache=self.cache, slots=slots, mask=mask, aux_layers=aux_layers)
        if params.greedy:
            path, emitted = greedy_verify(tree.tokens, tree.parents, logits[0])
        else:
            path, emitted = sample_verify(tree.tokens, tree.parents, target_probs(logits[0], params), generator)
        src = torch.tensor(path, device=device) + prefix
        for kv in (self.cache.k, self.cache.v):  # keep only the accepted path, in order
            kv[:, 0, :, prefix:prefix + len(path)] = kv[:, 0, :, src]
        return path, emitted, aux
