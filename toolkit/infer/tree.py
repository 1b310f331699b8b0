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


@torch.no_grad()
def draft_tree(head: Eagle3Head, embed: torch.nn.Embedding, cache: KVCache, prefix: int, root: int,
               root_out: torch.Tensor, root_logp: torch.Tensor, cfg: TreeConfig) -> Tree:
    """Grow a tree after `root` (the last emitted token). The draft cache holds positions 0..prefix-1 (the
    root's own pair is the last); expanded nodes are written to slots prefix, prefix + 1, ..."""
    device = root_logp.device
    # candidate nodes; index 0 is the root. parent / draft token / cumulative score / depth / output hidden
    parent, token, score, depth = [-1], [root], [0.0], [0]
    out = {0: root_out}
    slot_of = {}  # expanded node -> draft cache slot
    top = root_logp.topk(cfg.topk)
    frontier = []
    for lp, t in zip(top.values.tolist(), head.to_target(top.indices).tolist()):
        parent.append(0), token.append(t), score.append(lp), depth.append(1)
        frontier.append(len(token) - 1)
    for _ in range(1, cfg.num_steps):
        nodes = sorted(frontier, key=lambda i: -score[i])[: cfg.topk]
        k0 = len(slot_of)
        for k, i in enumerate(nodes):
            slot_of[i] = prefix + k0 + k
        slots = torch.tensor([[slot_of[i] for i in nodes]], device=device)
        positions = torch.tensor([[prefix - 1 + depth[i] for i in nodes]], device=device)
        kv_len = int(slots.max()) + 1
        mask = torch.zeros(1, len(nodes), kv_len, dtype=torch.bool, device=device)
        mask[..., :prefix] = True
        for r, i in enumerate(nodes):  # the node and its expanded ancestors
            j = i
            while j > 0:
                mask[0, r, slot_of[j]] = True
                j = parent[j]
        emb = embed(torch.tensor([[token[i] for i in nodes]], device=device))
        hid = torch.stack([out[parent[i]] for i in nodes])[None]
        logp, h = head(emb, hid, positions, cache, slots=slots, mask=mask)
        frontier = []
        for r, i in enumerate(nodes):
            out[i] = h[0, r]
            top = logp[0, r].topk(cfg.topk)
            for lp, t in zip(top.values.tolist(), head.to_target(top.indices).tolist()):
                parent.append(i), token.append(t), score.append(score[i] + lp), depth.append(depth[i] + 1)
                frontier.append(len(token) - 1)
    keep = sorted(range(1, len(token)), key=lambda i: (-score[i], depth[i]))[: cfg.num_draft_tokens - 1]
    order = [0] + sorted(keep)  # creation order: parents before children
    index = {old: new for new, old in enumerate(order)}
    return Tree(torch.tensor([token[i] for i in order]),
                torch.tensor([-1] + [index[parent[i]] for i in order[1:]]),
                torch.tensor([depth[i] for i in order]))
