"""The tensor-only EAGLE-2 tree growth (toolkit/infer/tree.py, no host sync, so CUDA graphs can hold the whole
draft loop) builds exactly the trees of the plain host-side reference (tree_reference.py), for chains and
trees, batches of different prefixes and full-width masks; chains take a lean path (grow_chain) that equals the
general one; and batched ancestor masks are right."""
import copy

import pytest
import torch
from tree_reference import reference_draft_trees

from toolkit.infer.config import ModelConfig
from toolkit.infer.drafts import random_head
from toolkit.infer.tree import TreeConfig, ancestor_masks, draft_trees, grow, grow_chain, grow_tree

TARGET = ModelConfig(model_type="llama", vocab_size=300, hidden_size=64, intermediate_size=96, num_layers=8,
                     num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=4096)


def test_ancestor_masks():
    parents = torch.tensor([[-1, 0, 0, 1, 3, 2]])
    m = ancestor_masks(parents, 3)[0]
    assert m[4].nonzero().flatten().tolist() == [0, 1, 3, 4]
    assert m[5].nonzero().flatten().tolist() == [0, 2, 5]
    assert m[0].nonzero().flatten().tolist() == [0]


@pytest.mark.parametrize("cfg", [TreeConfig(1, 1, 2), TreeConfig(5, 1, 6), TreeConfig(3, 3, 8), TreeConfig(4, 4, 16),
                                 TreeConfig(6, 10, 60)], ids=["one", "chain5", "tree3x3", "tree4x4", "tree6x10"])
def test_tensor_growth_equals_the_host_reference(cfg):
    head = random_head(TARGET, seed=3)
    with torch.no_grad():  # sharper draft distributions than std 0.02 gives: varied, tie-free scores
        head.lm_head.weight.normal_(0.0, 1.0)
    embed = torch.nn.Embedding(TARGET.vocab_size, TARGET.hidden_size)
    prefixes, roots = [7, 12, 3], [5, 9, 200]
    cache = head.new_cache(64, batch=3)
    g = torch.Generator().manual_seed(0)
    cache.k.copy_(torch.randn(cache.k.shape, generator=g))
    cache.v.copy_(torch.randn(cache.v.shape, generator=g))
    root_out = torch.randn(3, TARGET.hidden_size, generator=g)
    root_logp = torch.randn(3, TARGET.vocab_size, generator=g).mul(3).log_softmax(-1)
    other = copy.deepcopy(cache)
    want = reference_draft_trees(head, embed, cache, prefixes, roots, root_out, root_logp, cfg)
    got = draft_trees(head, embed, other, prefixes, roots, root_out, root_logp, cfg)
    for w, t in zip(want, got):
        assert t.tokens.tolist() == w.tokens.tolist()
        assert t.parents.tolist() == w.parents.tolist() and t.depth.tolist() == w.depth.tolist()
        assert torch.equal(t.ancestor_mask(), w.ancestor_mask())
    assert torch.allclose(other.k, cache.k, atol=1e-5)  # the same draft KV in the same slots (masks differ in width)

    # masks as wide as the cache (what CUDA graphs replay) grow the same trees
    def forward(emb, hidden, positions, slots, mask, **kw):
        return head(emb, hidden, positions, other, slots=slots, mask=mask, kv_len=64, **kw)

    tokens, parents, _ = grow(head, embed, forward, torch.tensor(prefixes), torch.tensor(roots), root_out, root_logp,
                              cfg, mask_len=64)
    assert tokens.tolist() == [w.tokens.tolist() for w in want]
    assert parents.tolist() == [w.parents.tolist() for w in want]


def test_a_sampled_chain_draws_each_token_from_the_tempered_draft():
    """grow with Gumbel noise: each node is the argmax of its step's log-probs * inv_temp + noise (the step's
    log-probs come back), zero noise gives the top-1 chain, and the first token is distributed as
    softmax(root_logp / T)."""
    head = random_head(TARGET, seed=3)
    with torch.no_grad():
        head.lm_head.weight.normal_(0.0, 1.0)
    embed = torch.nn.Embedding(TARGET.vocab_size, TARGET.hidden_size)
    cfg, B, g = TreeConfig(4, 1, 5), 3, torch.Generator().manual_seed(1)
    root_out = torch.randn(B, TARGET.hidden_size, generator=g)
    root_logp = torch.randn(B, TARGET.vocab_size, generator=g).mul(3).log_softmax(-1)
    prefixes, roots = [7, 12, 3], [5, 9, 200]
    gumbel = -torch.log(-torch.log(torch.rand(B, cfg.num_steps, TARGET.vocab_size, generator=g)))
    inv_temp = torch.tensor([1.0, 2.0, 0.5])
    trees = draft_trees(head, embed, head.new_cache(64, batch=B), prefixes, roots, root_out, root_logp, cfg,
                        gumbel=gumbel, inv_temp=inv_temp)
    for b, t in enumerate(trees):
        assert t.parents.tolist() == [-1, 0, 1, 2, 3] and t.draft_logp.shape == (4, TARGET.vocab_size)
        assert torch.equal(t.draft_logp[0], root_logp[b])
        want = head.to_target((t.draft_logp * inv_temp[b] + gumbel[b]).argmax(-1))
        assert t.tokens[1:].tolist() == want.tolist()
    top1 = draft_trees(head, embed, head.new_cache(64, batch=B), prefixes, roots, root_out, root_logp, cfg)
    quiet = draft_trees(head, embed, head.new_cache(64, batch=B), prefixes, roots, root_out, root_logp, cfg,
                        gumbel=torch.zeros_like(gumbel), inv_temp=torch.ones(B))
    assert [t.tokens.tolist() for t in quiet] == [t.tokens.tolist() for t in top1]

    n, T = 20_000, 1.5  # one step, many rows: the Gumbel-max draw is a draw from softmax(logp / T)
    logp = (torch.randn(8, generator=g) * 2).log_softmax(-1)
    small = TreeConfig(1, 1, 2)
    noise = -torch.log(-torch.log(torch.rand(n, 1, 8, generator=g)))
    tokens, _, _, back = grow(head, embed, None, torch.ones(n, dtype=torch.long), torch.zeros(n, dtype=torch.long),
                              torch.zeros(n, TARGET.hidden_size), logp.expand(n, 8), small, gumbel=noise,
                              inv_temp=torch.full((n,), 1 / T))
    freq = torch.bincount(tokens[:, 1] - head.to_target(torch.zeros(1, dtype=torch.long)), minlength=8) / n
    assert 0.5 * (freq - (logp / T).softmax(-1)).abs().sum() < 0.015
    with pytest.raises(ValueError, match="chains only"):
        grow(head, embed, None, torch.ones(1, dtype=torch.long), torch.zeros(1, dtype=torch.long),
             torch.zeros(1, TARGET.hidden_size), logp[None], TreeConfig(2, 2, 3), gumbel=noise[:1], inv_temp=None)


def test_a_chain_makes_every_steps_rope_and_mask_once_a_round():
    """grow_chain asks the head for its steps' RoPE tables and attention bias once (step-major rows), and each
    step's forward gets its own rows: the same log-probs as a forward that makes them itself."""
    head = random_head(TARGET, seed=4)
    embed = torch.nn.Embedding(TARGET.vocab_size, TARGET.hidden_size)
    cfg, g = TreeConfig(5, 1, 6), torch.Generator().manual_seed(3)
    prefix, roots = torch.tensor([4, 9]), torch.tensor([1, 2])
    root_out = torch.randn(2, TARGET.hidden_size, generator=g)
    root_logp = torch.randn(2, TARGET.vocab_size, generator=g).log_softmax(-1)
    made, steps = [], []
    step_inputs = head.step_inputs
    head.step_inputs = lambda *a: made.append(a[0].clone()) or step_inputs(*a)
    cache, check = head.new_cache(64, batch=2), head.new_cache(64, batch=2)

    def forward(emb, hidden, positions, slots, mask, pre=None, **kw):
        steps.append(pre)
        own = head(emb, hidden, positions, check, slots=slots, mask=mask, kv_len=64,  # its own step inputs
                   pre=step_inputs(positions, mask, emb.dtype), **kw)
        got = head(emb, hidden, positions, cache, slots=slots, mask=mask, kv_len=64, pre=pre, **kw)
        assert torch.equal(own[0], got[0]) and torch.equal(own[1], got[1])
        return got

    with torch.no_grad():
        grow_chain(head, embed, forward, prefix, roots, root_out, root_logp, cfg, 64)
    assert len(made) == 1 and made[0][:, 0].tolist() == [4, 9, 5, 10, 6, 11, 7, 12]  # one call, step-major
    assert len(steps) == 4 and all(p is not None and p[0].shape[0] == 2 for p in steps)


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_the_lean_chain_equals_the_general_growth(sampled):
    """grow sends topk 1 to grow_chain: the same tokens, parents, depths, log-probs and draft KV as grow_tree,
    for a batch of different prefixes over full-width (graph) masks."""
    head = random_head(TARGET, seed=5)
    with torch.no_grad():
        head.lm_head.weight.normal_(0.0, 1.0)
    embed = torch.nn.Embedding(TARGET.vocab_size, TARGET.hidden_size)
    cfg, B, g = TreeConfig(6, 1, 7), 3, torch.Generator().manual_seed(2)
    prefix, roots = torch.tensor([7, 12, 3]), torch.tensor([5, 9, 200])
    root_out = torch.randn(B, TARGET.hidden_size, generator=g)
    root_logp = torch.randn(B, TARGET.vocab_size, generator=g).mul(3).log_softmax(-1)
    extra = {}
    if sampled:
        extra = {"gumbel": -torch.log(-torch.log(torch.rand(B, cfg.num_steps, TARGET.vocab_size, generator=g))),
                 "inv_temp": torch.tensor([1.0, 2.0, 0.5])}
    caches = [head.new_cache(64, batch=B) for _ in range(2)]
    outs = []
    for grower, cache in zip((grow_chain, grow_tree), caches):
        def forward(emb, hidden, positions, slots, mask, cache=cache, **kw):
            return head(emb, hidden, positions, cache, slots=slots, mask=mask, kv_len=64, **kw)

        with torch.no_grad():
            outs.append(grower(head, embed, forward, prefix, roots, root_out, root_logp, cfg, 64, **extra))
    assert len(outs[0]) == len(outs[1]) == (4 if sampled else 3)
    for a, b in zip(*outs):
        assert a.shape == b.shape and torch.allclose(a.float(), b.float(), atol=1e-6)
    assert outs[0][1].tolist() == [list(range(-1, 6))] * B and outs[0][0][:, 0].tolist() == roots.tolist()
    assert torch.equal(caches[0].k, caches[1].k) and torch.equal(caches[0].v, caches[1].v)
