"""The runner (toolkit/infer/runner.py): its cache sizes, the verify forward through replayed graphs (eager_capture
on CPU) equal to the eager one, and a row move carrying both caches. The engine's end-to-end tests (test_engine*,
test_graphs, test_continuous_batching) run every round through it."""
import pytest
import torch

from toolkit.infer.drafts import random_head
from toolkit.infer.graphs import eager_capture
from toolkit.infer.loading import load_target
from toolkit.infer.runner import Runner
from toolkit.infer.tree import TreeConfig


@pytest.fixture(scope="module")
def target(tiny_target):
    return load_target(tiny_target)


def test_caches_hold_max_len_plus_one_round_plus_a_lookup_branch(target):
    tree = TreeConfig(3, 2, 6)
    eager = Runner(target, random_head(target.config, seed=1), tree, extra=4, max_len=32, max_batch=2)
    assert eager.widest() == 6 + 4
    assert eager.cache.k.shape[1] == 2 and eager.cache.k.shape[3] == 32 + 6 + 4  # [L, B, Hkv, S, D]
    graphed = Runner(target, random_head(target.config, seed=1), tree, extra=0, max_len=32, max_batch=2,
                     cuda_graphs=True, graph_capture=eager_capture)
    assert graphed.cache.k.shape[3] == 32 + 6 + 1  # the scratch slot graphs pad into
    assert Runner(target, None, TreeConfig(1, 1, 2), 0, 32, 1).widest() == 1  # no head: the root alone


def test_verify_through_graphs_equals_the_eager_forward(target):
    head, tree = random_head(target.config, seed=1), TreeConfig(3, 1, 4)
    runs = [Runner(target, head, tree, 0, 32, 3), Runner(target, head, tree, 0, 32, 3, cuda_graphs=True,
                                                           graph_capture=eager_capture)]
    prompts = torch.tensor([[1, 504, 3575, 282, 19, 7], [1, 88, 9, 4000, 17, 5]])  # 2 rows: padded to bucket 2
    outs = []
    for r in runs:
        r.prefill(prompts, 0, torch.tensor([5, 5]), r.aux_layers)
        slots = torch.arange(6, 10).repeat(2, 1)                                   # [2, 4] a chain after 6 slots
        mask = torch.arange(10)[None, None, :] <= slots[:, :, None]                 # [2, 4, 10]
        tokens = torch.tensor([[11, 12, 13, 14], [21, 22, 23, 24]])
        outs.append(r.verify(tokens, slots, slots, mask))
    (logits, aux), (g_logits, g_aux) = outs
    assert r.target_graphs is not None and runs[0].target_graphs is None
    assert logits.shape == (2, 4, target.config.vocab_size) and len(aux) == len(head.aux_layers)
    torch.testing.assert_close(g_logits, logits, rtol=0, atol=1e-4)  # a padded bucket sums in another order
    for a, b in zip(g_aux, aux):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4)  # a padded bucket sums in another order


def test_a_row_move_carries_the_target_and_the_draft_cache(target):
    r = Runner(target, random_head(target.config, seed=1), TreeConfig(2, 1, 3), 0, 16, 3)
    for cache in (r.cache, r.draft_cache):
        cache.k.normal_()
        cache.v.normal_()
    before = [(c.k[:, 2, :, :5].clone(), c.v[:, 2, :, :5].clone()) for c in (r.cache, r.draft_cache)]
    r.move(2, 0, 5)
    for c, (k, v) in zip((r.cache, r.draft_cache), before):
        assert torch.equal(c.k[:, 0, :, :5], k) and torch.equal(c.v[:, 0, :, :5], v)
        assert not torch.equal(c.k[:, 0, :, 5:], c.k[:, 2, :, 5:])  # only the first 5 slots move
