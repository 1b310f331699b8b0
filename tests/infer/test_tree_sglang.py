"""toolkit/infer/tree.py grows the same EAGLE-2 dynamic tree as SGLang for the same draft outputs.

What SGLang does (sgl-project/sglang, python/sglang/srt/speculative/eagle_worker.py `EAGLEWorker.draft_forward`,
spec_utils.py `select_top_k_tokens` / `_select_top_k_tokens_first` / `_select_top_k_tokens_later`,
eagle_utils.py `organize_draft_results` / `build_tree_kernel_efficient`, utils `fast_topk` = torch.max for k = 1,
torch.topk otherwise), for --speculative-num-steps S, --speculative-eagle-topk k, --speculative-num-draft-tokens n:

  * scores are cumulative *probabilities*: the draft's softmax probs, multiplied along the path
    (`expand_scores = scores.unsqueeze(2) * topk_p`), not summed log-probs; the order is the same.
  * select step 0: the root's top-k (from the draft extend) are layer 1, score list entry [b, 1, k], and all
    k of them are the frontier, in the root's top-k order (no selection).
  * select step i = 1..S-1: the draft runs once on the k frontier nodes, each keeps its top-k children
    (fast_topk of the softmax), their k*k cumulative scores are appended to the score list row-major
    (frontier node j, child rank c -> k + (i-1) k^2 + j k + c), and torch.topk of those k*k (this layer
    only, not older layers) is the next frontier. The frontier chosen at step S-1 is never expanded.
    So there are k + (S-1) k^2 candidates.
  * organize_draft_results: torch.topk over all k + (S-1) k^2 scores keeps n - 1, the kept indices are
    sorted ascending (creation order), and the verified (root) token goes first.
  * build_tree_kernel_efficient: a kept node's parent is the frontier node whose expansion made it
    (parent_list[index // k]), looked up among the kept ones; depth = how many ancestors up to the root,
    positions = seq_len + depth, retrieve_next_token = first (lowest-index) kept child, siblings ascending.

Where tree.py follows SGLang op for op: the draft's top-k per node and the next frontier are torch.topk, as
SGLang's fast_topk, and the layer layout is the same, so even among equal scores the same nodes are expanded
(on the same device). The first expansion takes the root's k children as the root's top-k gave them; tree.py
used to take a top-k of them again, which with equal scores could reorder them and so the next layer and its
frontier (the "coarse" case below failed on 4x4, 5x8, 6x10 before the fix).

The one deliberate difference, documented in tree.py: the final rerank. SGLang's torch.topk leaves the order
among equal scores unspecified, and a child whose draft prob is exactly 1 ties its parent, so SGLang can keep
a child without its parent (build_tree_kernel_efficient then prints "invalid eagle tree!!! Detected a token
with no parent token selected ... The token will be ignored"). tree.py keeps the lowest index (creation order)
among equals, the one rule under which the kept set is always a tree. The reference does the same there
(stable_topk); with torch.topk instead, 21 of the 36 tie cases below keep an orphan on CPU. Without ties
(the "random" case) the two rules are the same and the check is against SGLang as is.

The fake draft gives each node log-probs that depend only on its token path (a hash carried in the hidden
state), so both growths see the same numbers whichever order they visit the nodes in."""
import pytest
import torch

from toolkit.infer.tree import TreeConfig, grow

N = 40  # draft vocabulary
MOD = 2_147_483_647


def child_hash(h: int, token: int) -> int:
    return (h * 1_000_003 + token + 1) % MOD


def node_logp(h: int, ties) -> torch.Tensor:
    """The draft's log-probs after the node with path hash h. False: random, normalised (tie-free).
    True: log2-probs that are a permutation of 0, -1, ..., -(N-1) (unnormalised: only the order matters; a top
    child of prob 1 ties its parent), so cumulative scores tie exactly, in sums and in products of powers of two
    alike. "coarse": log2-probs in {0, -1, -2}, so a node's own candidates tie too (the root's k children
    among them)."""
    g = torch.Generator().manual_seed(h)
    if ties == "coarse":
        return -torch.randint(0, 3, (N,), generator=g).double()
    if ties:
        return -torch.randperm(N, generator=g).double()
    return (torch.randn(N, generator=g, dtype=torch.float64) * 2).log_softmax(-1)


def node_probs(h: int, ties) -> torch.Tensor:
    lp = node_logp(h, ties)
    return torch.exp2(lp) if ties else lp.exp()


class FakeHead:
    kernels = "torch"

    @staticmethod
    def to_target(ids):
        return ids


def fake_forward(ties):
    """forward(emb, hidden, ...) for grow: emb[..., 0] is the token, hidden[..., 0] the parent's path hash; the
    output hidden is the node's own path hash, the log-probs node_logp of it."""
    def forward(emb, hidden, positions, slots, mask, **kw):
        tok, par = emb[..., 0].long(), hidden[..., 0].long()
        h = (par * 1_000_003 + tok + 1) % MOD
        logp = torch.stack([node_logp(int(x), ties) for x in h.flatten()]).view(*h.shape, N)
        return logp, h.double()[..., None]

    return forward


def stable_topk(x: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest of a 1-D tensor, descending, the lowest index first among equals (the final
    rerank's tie rule; SGLang's torch.topk leaves it unspecified)."""
    return torch.sort(x, descending=True, stable=True).indices[:k]


def sglang_tree(root: int, root_hash: int, S: int, k: int, n: int, ties):
    """SGLang's draft_forward + organize_draft_results + build_tree_kernel_efficient for one sequence, in
    probability space (cumulative products of the draft's probs): (tokens, parents, depth) of the n verified
    nodes, root first, in SGLang's order (ascending score-list index)."""
    p = node_probs(root_hash, ties)
    top = p.topk(k).indices
    score, token, parent, hsh = list(p[top]), top.tolist(), [-1] * k, [child_hash(root_hash, t) for t in top.tolist()]
    frontier = list(range(k))                        # score-list indices; step 0: all k, the root's order
    for i in range(1, S):
        first = len(score)
        for j, node in enumerate(frontier):          # row-major: frontier node j, child rank c
            q = node_probs(hsh[node], ties)
            kids = q.topk(k).indices
            for t in kids.tolist():
                score.append(score[node] * q[t])
                token.append(t)
                parent.append(node)
                hsh.append(child_hash(hsh[node], t))
        layer = torch.stack(score[first:])
        frontier = [first + int(x) for x in layer.topk(k).indices]  # SGLang's fast_topk: torch.topk
    assert len(score) == k + (S - 1) * k * k
    keep = sorted(stable_topk(torch.stack(score), n - 1).tolist())
    pos = {old: new + 1 for new, old in enumerate(keep)}
    parents, depth = [-1], [0]
    for i in keep:
        assert parent[i] == -1 or parent[i] in pos, "SGLang: a kept token with no kept parent"
        parents.append(0 if parent[i] == -1 else pos[parent[i]])
        depth.append(depth[parents[-1]] + 1)
    return [root] + [token[i] for i in keep], parents, depth


def paths(tokens, parents):
    out = []
    for i in range(len(tokens)):
        p, j = [], i
        while j >= 0:
            p.append(tokens[j])
            j = parents[j]
        out.append(tuple(reversed(p)))
    return out


CONFIGS = [(3, 2, 4), (4, 4, 16), (6, 10, 60), (5, 8, 32), (2, 3, 12), (3, 3, 22)]


@pytest.mark.parametrize("ties", [False, True, "coarse"], ids=["random", "ties", "coarse"])
@pytest.mark.parametrize("B", [1, 3])
@pytest.mark.parametrize("S,k,n", CONFIGS, ids=[f"{s}x{k}->{n}" for s, k, n in CONFIGS])
def test_grow_selects_sglangs_tree(S, k, n, B, ties):
    cfg = TreeConfig(S, k, n)
    roots = torch.tensor([5, 17, 33][:B])
    prefix = torch.tensor([7, 12, 3][:B])
    root_hash = [1000 + 7919 * b + int(r) for b, r in enumerate(roots)]
    root_logp = torch.stack([node_logp(h, ties) for h in root_hash])
    root_out = torch.tensor(root_hash, dtype=torch.float64)[:, None]
    embed = torch.nn.Embedding(N, 1, dtype=torch.float64)
    with torch.no_grad():
        embed.weight.copy_(torch.arange(N, dtype=torch.float64)[:, None])
    tokens, parents, depth = grow(FakeHead(), embed, fake_forward(ties), prefix, roots, root_out, root_logp, cfg)
    assert tokens.shape == parents.shape == depth.shape == (B, n)
    for b in range(B):
        want = sglang_tree(int(roots[b]), root_hash[b], S, k, n, ties)
        got = tokens[b].tolist(), parents[b].tolist(), depth[b].tolist()
        assert paths(got[0], got[1]) == paths(want[0], want[1])  # the same nodes, in the same order
        assert got == want                                        # ... hence the same parents and depths


def test_the_tie_cases_really_tie():
    """The tie cases have what they are for: child scores equal to their parent's (a top draft prob of 1),
    equal cumulative scores within a layer, and ("coarse") equal scores among the root's k children."""
    lp = node_logp(123, True)
    assert lp.max() == 0 and len(set(lp.tolist())) == N
    coarse = torch.stack([node_logp(1000 + 7919 * b + r, "coarse") for b, r in enumerate([5, 17, 33])])
    assert all(len(set(row.topk(4).values.tolist())) < 4 for row in coarse)  # the root's 4 best tie
    S, k = 4, 4
    embed = torch.nn.Embedding(N, 1, dtype=torch.float64)
    with torch.no_grad():
        embed.weight.copy_(torch.arange(N, dtype=torch.float64)[:, None])
    seen = []
    forward = fake_forward(True)

    def spy(*a, **kw):
        out = forward(*a, **kw)
        seen.append(out[0])
        return out

    grow(FakeHead(), embed, spy, torch.tensor([7]), torch.tensor([5]), torch.tensor([[1005.0]], dtype=torch.float64),
         node_logp(1005, True)[None], TreeConfig(S, k, 16))
    assert len(seen) == S - 1 and all((x.max(-1).values == 0).all() for x in seen)  # every top child: prob 1
    second = (node_logp(1005, True).topk(k).values[:, None] + seen[0].topk(k).values).flatten()
    assert len(set(second.tolist())) < k * k  # equal cumulative scores in layer 2
