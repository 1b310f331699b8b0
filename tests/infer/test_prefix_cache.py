"""Automatic prefix caching (toolkit/infer/prefix_cache.py, the engine's `prefix_cache_rows`): which row a prompt
reuses and how much of it; a conversation's later turn takes its earlier turn's row; least recently used rows go
first; and in the engine, greedy output with the cache is output without it, token for token, for plain decoding,
EAGLE-3 chains and trees, an MTP chain and a batch, while second turns prefill only what is new."""
import pytest

from toolkit.infer.prefix_cache import PrefixCache, shared


def test_shared_counts_leading_ids():
    import numpy as np

    assert shared(np.array([1, 2, 3]), np.array([1, 2, 4, 5])) == 2
    assert shared(np.array([1, 2]), np.array([1, 2, 3])) == 2 and shared(np.array([7]), np.array([1])) == 0


def test_match_leaves_a_token_to_prefill_and_stays_within_the_draft_pairs():
    cache, copied = PrefixCache(first_row=4, rows=2), []
    cache.store([1, 2, 3, 4, 5, 6], drafted=6, copy=copied.append)
    assert copied == [4] and cache.match([9, 9, 9]) == (None, 0)
    assert cache.match([1, 2, 3, 4, 5, 6]) == (4, 5)  # the whole prompt held: its last token is prefilled again
    assert cache.match([1, 2, 3, 4, 5, 6, 7, 8]) == (4, 5)  # position 5 again: the draft pair there needs its hidden
    assert cache.match([1, 2, 3, 0]) == (4, 2)
    cache.store([5, 5, 5, 5, 5], drafted=2, copy=copied.append)  # the draft fell behind at the end
    assert copied == [4, 5] and cache.match([5, 5, 5, 5, 5, 5]) == (5, 2)
    assert cache.queried == 6 + 8 + 4 + 3 + 6 and cache.hit == 5 + 5 + 2 + 2
    # a prompt admitted just before this one (its row prefilled first) is a source too, the longer share wins
    assert cache.match([1, 2, 3, 4, 5, 6, 7, 8], earlier=[(0, [1, 2, 3, 4, 5, 6, 7, 9])]) == (0, 6)
    assert cache.match([1, 2, 3, 0], earlier=[(1, [1, 2, 7])]) == (4, 2)


def test_a_later_turn_takes_its_earlier_turns_row_and_the_oldest_row_goes_first():
    cache, copied = PrefixCache(first_row=2, rows=2), []
    cache.store([1, 2, 3], 3, copied.append)
    cache.store([7, 8, 9], 3, copied.append)
    cache.store([1, 2, 3, 4, 5], 5, copied.append)  # extends the first: same row, no eviction
    assert copied == [2, 3, 2] and sorted(e.row for e in cache.entries) == [2, 3]
    cache.store([1, 2, 3], 3, copied.append)  # held already (as a prefix of row 2's): nothing copied
    assert copied == [2, 3, 2]
    cache.match([7, 8, 9, 1])  # row 3 used last: row 2 is now the least recently used
    cache.store([4, 4, 4], 3, copied.append)
    assert copied[-1] == 2 and cache.match([1, 2, 3, 4, 5, 6]) == (None, 0) and cache.match([7, 8, 9]) == (3, 2)
    cache.clear()
    assert cache.entries == [] and sorted(cache.free) == [2, 3]
    with pytest.raises(ValueError, match="at least one spare row"):
        PrefixCache(0, 0)


@pytest.fixture(scope="module")
def target(tiny_target):
    from toolkit.infer.loading import load_target

    return load_target(tiny_target)


def make_head(target, kind):
    """None (plain decoding), a random EAGLE-3 head, or a random MTP module over the target's lm_head."""
    import torch

    from toolkit.infer.drafts import random_head
    from toolkit.infer.mtp import MTPHead

    if kind == "plain":
        return None
    if kind != "mtp":
        return random_head(target.config, seed=1)
    torch.manual_seed(3)
    head = MTPHead(target.config, target.lm_head.weight.detach())
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name != "lm_head.weight":
                p.copy_(torch.randn_like(p) * (0.2 if p.dim() > 1 else 0.1) + (p.dim() == 1 and "norm" in name))
    return head.eval()


TREES = {"plain": None, "chain": (4, 1, 5), "tree": (3, 3, 8), "mtp": (2, 1, 3)}


@pytest.mark.parametrize("kind", list(TREES))
def test_greedy_with_the_prefix_cache_is_greedy_without_and_second_turns_prefill_less(target, kind):
    from toolkit.infer.engine import Engine
    from toolkit.infer.sampling import SamplingParams
    from toolkit.infer.tree import TreeConfig

    head, tree = make_head(target, kind), TREES[kind] and TreeConfig(*TREES[kind])
    plain = Engine(target, head, tree, max_len=160)
    cached = Engine(target, head, tree, max_len=160, prefix_cache_rows=2)
    params = SamplingParams(max_new_tokens=12)
    system = [1, 504, 3575, 282, 19, 88, 9, 4000, 17]
    turn1 = system + [2201, 77, 301]
    got = cached.generate(turn1, params)
    assert got.tokens == plain.generate(turn1, params).tokens and got.cached_tokens == 0
    turn2 = turn1 + got.tokens + [5, 6, 7]  # the first turn and its answer re-sent, then more
    again = cached.generate(turn2, params)
    assert again.tokens == plain.generate(turn2, params).tokens
    assert len(turn1) <= again.cached_tokens < len(turn1) + len(got.tokens)  # the draft's last round: not held
    other = system + [600, 601, 602, 603]  # a shared system prompt, another question
    third = cached.generate(other, params)
    assert third.tokens == plain.generate(other, params).tokens
    assert third.cached_tokens == len(system) - 1  # the last shared position again: its draft pair reads the next id
    hits_before = cached.prefix_cache.hit
    assert cached.generate(turn2, params).tokens == again.tokens and cached.prefix_cache.hit > hits_before


def test_a_batch_of_hits_and_misses_equals_each_alone(target):
    from toolkit.infer.engine import Engine
    from toolkit.infer.sampling import SamplingParams
    from toolkit.infer.tree import TreeConfig

    head, tree = make_head(target, "tree"), TreeConfig(3, 3, 8)
    params = SamplingParams(max_new_tokens=10)
    seen = [[1, 45, 46, 47, 48, 49, 50, 51, 52], [1, 9, 9, 9, 9, 9, 9, 9]]
    prompts = [seen[0] + [60, 61], [1, 31000, 4, 5], seen[1] + [7], [1, 12, 13], [1, 600, 601, 602, 603, 604]]
    alone = Engine(target, head, tree, max_len=96)
    want = [alone.generate(p, params).tokens for p in prompts]
    eng = Engine(target, head, tree, max_len=96, max_batch=5, prefix_cache_rows=3)
    eng.generate_batch(seen, params)  # two finished conversations held
    got = eng.generate_batch(prompts, params)
    assert [r.tokens for r in got] == want
    assert [r.cached_tokens > 0 for r in got] == [True, False, True, False, False]
    scored = SamplingParams(max_new_tokens=2, prompt_logprobs=1)  # every position's logits: never from the cache
    assert eng.generate(prompts[0], scored).cached_tokens == 0


def test_n_copies_of_a_prompt_admitted_together_prefill_it_once(target):
    from toolkit.infer.engine import Engine
    from toolkit.infer.sampling import SamplingParams
    from toolkit.infer.tree import TreeConfig

    head, tree = make_head(target, "chain"), TreeConfig(4, 1, 5)
    params = SamplingParams(max_new_tokens=8)
    base = [1, 45, 46, 47, 48, 49, 50, 51, 52, 53]
    prompts = [base, base, base + [7, 8], [1, 12, 13]]  # n = 2 choices of one prompt, a longer one, another
    alone = Engine(target, head, tree, max_len=64)
    want = [alone.generate(p, params).tokens for p in prompts]
    got = Engine(target, head, tree, max_len=64, max_batch=4, prefix_cache_rows=1).generate_batch(prompts, params)
    assert [r.tokens for r in got] == want
    assert [r.cached_tokens for r in got] == [0, len(base) - 1, len(base) - 1, 0]
