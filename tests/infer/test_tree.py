"""The tensor-only EAGLE-2 tree growth (toolkit/infer/tree.py, no host sync, so CUDA graphs can hold the whole
draft loop) builds exactly the trees of the plain host-side reference (tree_reference.py), for chains and
trees, batches of different prefixes and full-width masks; and batched ancestor masks are right."""
import copy

import pytest
import torch
from tree_reference import reference_draft_trees

from toolkit.infer.config import ModelConfig
from toolkit.infer.drafts import random_head
from toolkit.infer.tree import TreeConfig, ancestor_masks, draft_trees, grow

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
    def forward(emb, hidden, positions, slots, mask):
        return head(emb, hidden, positions, other, slots=slots, mask=mask, kv_len=64)

    tokens, parents, _ = grow(head, embed, forward, torch.tensor(prefixes), torch.tensor(roots), root_out, root_logp,
                              cfg, mask_len=64)
    assert tokens.tolist() == [w.tokens.tolist() for w in want]
    assert parents.tolist() == [w.parents.tolist() for w in want]
