"""Draft trees: chain (topk = 1) and the EAGLE-2 dynamic tree, with SGLang's meaning of the knobs.

  num_steps         draft forwards per round (tree depth)
  topk              candidates kept per expanded node, and nodes expanded per step
  num_draft_tokens  tokens the target verifies per round, the root (last emitted token) included

Step 0 takes the topk tokens of the draft's prediction at the root. Each later step runs the draft once on
the topk frontier nodes of highest cumulative log-prob, and adds their topk children as candidates. At the
end all candidates are reranked by cumulative log-prob and the best num_draft_tokens - 1 are kept (a child
never scores above its parent, so the kept set is a tree). Node 0 of the result is the root.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from toolkit.infer.drafts import Eagle3Head
from toolkit.infer.kv_cache import KVCache


@dataclass(frozen=True)
class TreeConfig:
    num_steps: int = 5
    topk: int = 1
    num_draft_tokens: int = 6

    def __post_init__(self):
        if self.num_steps < 1 or self.topk < 1:
            raise ValueError(f"--num-steps and --topk must be >= 1, got {self.num_steps}, {self.topk}")
        most = 1 + self.topk + (self.num_steps - 1) * self.topk * self.topk
        if not 2 <= self.num_draft_tokens <= most:
            raise ValueError(f"--num-draft-tokens {self.num_draft_tokens}: must be in 2..{most} for "
                             f"--num-steps {self.num_steps} --topk {self.topk}")
        if self.topk == 1 and self.num_draft_tokens != self.num_steps + 1:
            raise ValueError(f"a chain (--topk 1) verifies num_steps + 1 = {self.num_steps + 1} tokens, "
                             f"got --num-draft-tokens {self.num_draft_tokens}")


@dataclass
class Tree:
    tokens: torch.Tensor   # int64 [n] target ids, node 0 = root
    parents: torch.Tensor  # int64 [n], parents[0] = -1, parents[i] < i
    depth: torch.Tensor    # int64 [n], depth[0] = 0

    def ancestor_mask(self) -> torch.Tensor:
        """bool [n, n]: node i may attend to node j (j is i or one of its ancestors)."""
        n = len(self.parents)
        mask = torch.eye(n, dtype=torch.bool)
        for i in range(1, n):
            mask[i] |= mask[int(self.parents[i])]
        return mask


class _Growth:
    """One sequence's candidate nodes while its tree grows; index 0 is the root."""

    def __init__(self, root: int, prefix: int, root_out: torch.Tensor):
        self.prefix = prefix
        self.parent, self.token, self.score, self.depth = [-1], [root], [0.0], [0]
        self.out = {0: root_out}  # expanded node -> draft output hidden (fed to its children)
        self.slot_of: dict[int, int] = {}  # expanded node -> draft cache slot
        self.frontier: list[int] = []  # candidates not expanded yet

    def add_children(self, node: int, logp: torch.Tensor, head: Eagle3Head, k: int) -> None:
        top = logp.topk(k)
        for lp, t in zip(top.values.tolist(), head.to_target(top.indices).tolist()):
            self.parent.append(node), self.token.append(t), self.depth.append(self.depth[node] + 1)
            self.score.append(self.score[node] + lp)
            self.frontier.append(len(self.token) - 1)

    def tree(self, keep_count: int) -> Tree:
        keep = sorted(range(1, len(self.token)), key=lambda i: (-self.score[i], self.depth[i]))[:keep_count]
        order = [0] + sorted(keep)  # creation order: parents before children
        index = {old: new for new, old in enumerate(order)}
        return Tree(torch.tensor([self.token[i] for i in order]),
                    torch.tensor([-1] + [index[self.parent[i]] for i in order[1:]]),
                    torch.tensor([self.depth[i] for i in order]))


@torch.no_grad()
def draft_trees(head: Eagle3Head, embed: torch.nn.Embedding, cache: KVCache, prefixes: list[int],
                roots: list[int], root_out: torch.Tensor, root_logp: torch.Tensor, cfg: TreeConfig,
                forward=None) -> list[Tree]:
    """Grow one tree per sequence after its root (the last emitted token), all sequences in lockstep.
    root_out [B, H], root_logp [B, N]. Sequence b's draft cache holds positions 0..prefixes[b]-1 (the
    root's own pair is the last); its expanded nodes go to slots prefixes[b], prefixes[b] + 1, ...
    forward(emb, hidden, positions, slots, mask) runs the head over `cache` (the engine passes its CUDA-graphed
    one); default: the head itself."""
    device = root_logp.device
    if forward is None:
        def forward(emb, hidden, positions, slots, mask):
            return head(emb, hidden, positions, cache, slots=slots, mask=mask)
    grow = [_Growth(r, p, root_out[b]) for b, (r, p) in enumerate(zip(roots, prefixes))]
    for b, g in enumerate(grow):
        g.add_children(0, root_logp[b], head, cfg.topk)
    for _ in range(1, cfg.num_steps):
        nodes = [sorted(g.frontier, key=lambda i, g=g: -g.score[i])[: cfg.topk] for g in grow]  # [B][topk]
        for g, ns in zip(grow, nodes):
            k0 = len(g.slot_of)
            for k, i in enumerate(ns):
                g.slot_of[i] = g.prefix + k0 + k
        slots = torch.tensor([[g.slot_of[i] for i in ns] for g, ns in zip(grow, nodes)], device=device)
        positions = torch.tensor([[g.prefix - 1 + g.depth[i] for i in ns] for g, ns in zip(grow, nodes)],
                                 device=device)
        kv_len = int(slots.max()) + 1
        mask = torch.zeros(len(grow), cfg.topk, kv_len, dtype=torch.bool, device=device)
        for b, (g, ns) in enumerate(zip(grow, nodes)):
            mask[b, :, :g.prefix] = True
            for r, i in enumerate(ns):  # the node and its expanded ancestors
                j = i
                while j > 0:
                    mask[b, r, g.slot_of[j]] = True
                    j = g.parent[j]
        emb = embed(torch.tensor([[g.token[i] for i in ns] for g, ns in zip(grow, nodes)], device=device))
        hid = torch.stack([torch.stack([g.out[g.parent[i]] for i in ns]) for g, ns in zip(grow, nodes)])
        logp, h = forward(emb, hid, positions, slots, mask)
        for b, (g, ns) in enumerate(zip(grow, nodes)):
            g.frontier = []
            for r, i in enumerate(ns):
                g.out[i] = h[b, r]
                g.add_children(i, logp[b, r], head, cfg.topk)
    return [g.tree(cfg.num_draft_tokens - 1) for g in grow]
