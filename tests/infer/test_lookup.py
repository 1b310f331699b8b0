"""Prompt lookup proposals and their graft onto a draft tree (toolkit/infer/lookup.py)."""
import pytest
import torch
from conftest import ROOT
from test_model import tiny_hf

from toolkit.infer.lookup import LookupConfig, graft, graft_all, propose
from toolkit.infer.tree import Tree, ancestor_masks


def test_proposes_what_followed_the_most_recent_occurrence_of_the_longest_suffix():
    cfg = LookupConfig(num_tokens=4, max_ngram=3)
    assert propose([1, 2, 3, 4, 5, 1, 2, 3], cfg) == [4, 5, 1, 2]
    # "2 3" occurs twice: the later occurrence wins
    assert propose([2, 3, 7, 9, 2, 3, 8, 6, 2, 3], cfg) == [8, 6, 2, 3]
    # the 3-gram "9 2 3" beats the more recent 2-gram "2 3"
    assert propose([9, 2, 3, 5, 5, 2, 3, 6, 9, 2, 3], cfg) == [5, 5, 2, 3]
    # no 3- or 2-gram match: fall back to the last token alone
    assert propose([4, 8, 1, 7, 5, 3, 1], cfg) == [7, 5, 3, 1]


def test_a_run_matches_itself_and_the_branch_is_cut_to_num_tokens():
    assert propose([5, 7, 7, 7], LookupConfig(num_tokens=10, max_ngram=2)) == [7]  # "7 7" at index 1 -> 7
    assert propose(list(range(20)) + [3], LookupConfig(num_tokens=3)) == [4, 5, 6]
    assert propose([1, 2, 3, 1], LookupConfig(num_tokens=10)) == [2, 3, 1]  # up to the end of the context


def test_nothing_matches():
    cfg = LookupConfig(num_tokens=5, max_ngram=3, min_ngram=2)
    assert propose([1, 2, 3, 4, 5], cfg) == []
    assert propose([1, 2, 3, 1], cfg) == []  # only a 1-gram matches, below min_ngram
    assert propose([], LookupConfig()) == [] and propose([7], LookupConfig()) == []


@pytest.mark.parametrize("kwargs, match", [({"num_tokens": 0}, "at least 1 token"),
                                           ({"max_ngram": 0}, "1 <= min"),
                                           ({"min_ngram": 4, "max_ngram": 3}, "1 <= min")])
def test_bad_config_is_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LookupConfig(**kwargs)


def tree(tokens, parents, depth):
    return Tree(torch.tensor(tokens), torch.tensor(parents), torch.tensor(depth))


def test_graft_shares_the_prefix_it_agrees_with_and_pads_with_parentless_nodes():
    # root 10; children 11, 12; 11 -> 13
    base = tree([10, 11, 12, 13], [-1, 0, 0, 1], [0, 1, 1, 2])
    out = graft(base, [11, 13, 20, 21], 9)
    # 11 and 13 exist already (nodes 1, 3): only 20 (child of 3) and 21 are new
    assert out.tokens.tolist() == [10, 11, 12, 13, 20, 21, 0, 0, 0]
    assert out.parents.tolist() == [-1, 0, 0, 1, 3, 4, -1, -1, -1]
    assert out.depth.tolist() == [0, 1, 1, 2, 3, 4, 0, 0, 0]
    mask = ancestor_masks(out.parents[None], 4)[0]
    assert mask[5].nonzero().flatten().tolist() == [0, 1, 3, 4, 5]  # the branch sees its whole path
    assert mask[6:].sum(1).tolist() == [1, 1, 1]                      # padding sees itself only
    assert not mask[:6, 6:].any()                                     # and nobody sees padding
    # a branch that differs at once hangs off the root; an empty one only pads
    assert graft(base, [12, 5], 6).parents.tolist() == [-1, 0, 0, 1, 2, -1]
    assert graft(base, [], 5).tokens.tolist() == [10, 11, 12, 13, 0]


def test_graft_all_pads_a_batch_to_its_largest_merge_not_to_the_longest_branch():
    base = tree([10, 11, 12], [-1, 0, 1], [0, 1, 2])  # the head's chain 10 -> 11 -> 12
    a, b = graft_all([base, base], [[11, 12, 13], [7]])
    # row 0's 3-token branch agrees with the chain for 2 tokens and adds one node; row 1's adds one: width 4, not 6
    assert a.tokens.tolist() == [10, 11, 12, 13] and a.parents.tolist() == [-1, 0, 1, 2]
    assert b.tokens.tolist() == [10, 11, 12, 7] and b.parents.tolist() == [-1, 0, 1, 0]
    assert a.depth.tolist() == [0, 1, 2, 3] and b.depth.tolist() == [0, 1, 2, 1]
    c, d = graft_all([base, base], [[11], []])  # a branch the head drafted already adds nothing
    assert c.tokens.tolist() == d.tokens.tolist() == [10, 11, 12]
    e, f = graft_all([base, base], [[5, 6], []])  # the other row pads with parentless nodes
    assert e.parents.tolist() == [-1, 0, 1, 0, 3] and f.parents.tolist() == [-1, 0, 1, -1, -1]


def test_graft_refuses_what_does_not_fit_and_sampled_chains():
    base = tree([10, 11], [-1, 0], [0, 1])
    with pytest.raises(ValueError, match="does not fit 3"):
        graft(base, [7, 8], 3)
    sampled = Tree(base.tokens, base.parents, base.depth, draft_logp=torch.zeros(1, 4))
    with pytest.raises(ValueError, match="draft law"):
        graft(sampled, [7], 4)


def test_lookup_policy_replay_takes_the_engines_rounds(tmp_path):
    """benchmarks/lookup_policy.py replays chain + lookup rounds offline: for a fixed branch length its round
    count equals the engine's verify steps on the same prompts (a tiny target that loops, a random head)."""
    import importlib.util

    from toolkit.infer.drafts import random_head
    from toolkit.infer.engine import Engine
    from toolkit.infer.loading import load_target
    from toolkit.infer.lookup import LookupConfig
    from toolkit.infer.sampling import SamplingParams
    from toolkit.infer.tree import TreeConfig

    spec = importlib.util.spec_from_file_location("lookup_policy", ROOT / "benchmarks/lookup_policy.py")
    policy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(policy)
    tiny_hf("llama", tmp_path)
    target = load_target(tmp_path)
    head = random_head(target.config, seed=3)
    prompts = [[5, 9, 14, 5, 9, 2, 7], [1, 2, 3, 4, 1, 2, 3], [40, 41, 42]]
    for n in (2, 6):
        engine = Engine(target, head, TreeConfig(3, 1, 4), max_len=128, lookup=LookupConfig(n))
        results = [engine.generate(p, SamplingParams(max_new_tokens=40)) for p in prompts]
        rows = [{"prompt": p, "answer": r.tokens} for p, r in zip(prompts, results)]
        every = [policy.head_chains(head, target, r["prompt"] + r["answer"], 3).tolist() for r in rows]
        got = policy.simulate(rows, every, [policy.Fixed(n), policy.Fixed(0)], lambda nodes: float(nodes))
        assert got[f"fixed {n}"][0] == sum(r.verify_steps for r in results)
        assert sum(r.from_lookup for r in results) > 0  # the branch carried some of it
    alone = [Engine(target, head, TreeConfig(3, 1, 4), max_len=128).generate(p, SamplingParams(max_new_tokens=40))
             for p in prompts]
    assert got["fixed 0"][0] == sum(r.verify_steps for r in alone)  # no branch: the head's chain alone
