"""The host-side EAGLE-2 tree growth the engine used before toolkit/infer/tree.py became tensor-only: Python
lists per sequence, easy to read. Kept as the reference the tensor version is checked against."""
import torch

from toolkit.infer.tree import Tree


class _Growth:
    """One sequence's candidate nodes while its tree grows; index 0 is the root."""

    def __init__(self, root: int, prefix: int, root_out: torch.Tensor):
        self.prefix = prefix
        self.parent, self.token, self.score, self.depth = [-1], [root], [0.0], [0]
        self.out = {0: root_out}  # expanded node -> draft output hidden (fed to its children)
        self.slot_of: dict[int, int] = {}  # expanded node -> draft cache slot
        self.frontier: list[int] = []  # candidates not expanded yet

    def add_children(self, node: int, logp: torch.Tensor, head, k: int) -> None:
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
def reference_draft_trees(head, embed: torch.nn.Embedding, cache, prefixes: list[int],
                roots: list[int], root_out: torch.Tensor, root_logp: torch.Tensor, cfg,
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
