"""CUDA graphs (toolkit/infer/graphs.py): bucketing, padding and the scratch slot, tested on CPU through
eager_capture (the same static buffers, no graph); an engine replaying graphs (target step, draft extend and
the whole draft loop) generates exactly what the eager engine does, for plain decoding, chains and trees, with
padded batches. tests/infer/test_gpu.py captures real graphs on a GPU."""
import pytest
import torch

from toolkit.infer.drafts import random_head
from toolkit.infer.engine import Engine
from toolkit.infer.graphs import GraphedForward, batch_buckets, eager_capture
from toolkit.infer.loading import load_target
from toolkit.infer.lookup import LookupConfig
from toolkit.infer.sampling import SamplingParams
from toolkit.infer.tree import TreeConfig

PROMPTS = [[1, 504, 3575, 282, 19], [1, 88, 9], [1, 4000, 17, 2201, 77, 301, 5, 6, 7]]


def test_batch_buckets():
    assert batch_buckets(1) == [1]
    assert batch_buckets(6) == [1, 2, 4, 6]
    assert batch_buckets(8) == [1, 2, 4, 8]


def test_inputs_are_padded_into_the_smallest_bucket():
    seen = []

    def fn(x, slots, mask):
        seen.append((x.clone(), slots.clone(), mask.clone()))
        return (x * 2.0, mask.sum(-1))

    g = GraphedForward(fn, {"x": torch.zeros(1, 1, 3)}, [(1, 1), (2, 4), (4, 4)], scratch=9, mask_len=10,
                       capture=eager_capture)
    assert g.bucket(1, 1) == (1, 1) and g.bucket(2, 2) == (2, 4) and g.bucket(3, 1) == (4, 4)
    assert g.bucket(5, 1) is None and g.bucket(1, 5) is None
    x = torch.arange(2 * 3 * 3, dtype=torch.float).view(2, 3, 3)
    mask = torch.ones(2, 3, 6, dtype=torch.bool)
    doubled, attended = g(x=x, slots=torch.tensor([[0, 1, 2], [3, 4, 5]]), mask=mask)
    assert torch.equal(doubled, 2 * x) and torch.equal(attended, torch.full((2, 3), 6))
    _, slots, m = seen[-1]                                     # what the (2, 4) graph computed on
    assert slots[:, 3].tolist() == [9, 9]                      # the pad token writes to the scratch slot ...
    assert m[:, 3].nonzero()[:, 1].tolist() == [0, 0]          # ... and attends to slot 0 alone, so that ...
    from toolkit.infer.kernels.tree_attention import reference_mask_lens
    assert reference_mask_lens(m).tolist() == [6, 6]           # ... the rows' attention bounds stay their own
    assert not m[:, :3, 6:].any()                              # real tokens: the mask is zero-padded on the right
    # a smaller call into the same bucket leaves nothing of the bigger one behind
    g(x=x[:1, :1], slots=torch.tensor([[4]]), mask=torch.ones(1, 1, 2, dtype=torch.bool))
    _, slots, m = seen[-1]
    assert slots.tolist() == [[4]] and m[0, 0].nonzero().flatten().tolist() == [0, 1]
    assert g(x=torch.zeros(5, 1, 3), slots=torch.zeros(5, 1, dtype=torch.long),
             mask=torch.ones(5, 1, 2, dtype=torch.bool)) is None
    with pytest.raises(ValueError, match="mask over 11 slots"):
        g(x=x, slots=torch.zeros(2, 3, dtype=torch.long), mask=torch.ones(2, 3, 11, dtype=torch.bool))


def counting(calls):
    def capture(fn, static, pool):
        replay, out = eager_capture(fn, static, pool)

        def counted():
            calls.append(tuple(static["slots"].shape) if "slots" in static else ("loop", len(static["prefix"])))
            replay()

        return counted, out

    return capture


@pytest.fixture(scope="module")
def target(tiny_target):
    return load_target(tiny_target)


@pytest.mark.parametrize("tree", [None, TreeConfig(4, 1, 5), TreeConfig(3, 3, 8)], ids=["plain", "chain", "tree"])
def test_graphed_engine_equals_eager(target, tree):
    head = None if tree is None else random_head(target.config, seed=1)
    params = SamplingParams(max_new_tokens=12)
    eager = Engine(target, head, tree, max_len=64, max_batch=4, cuda_graphs=False)
    want = [eager.generate_batch(PROMPTS, params), eager.generate_batch(PROMPTS[:1], params)]
    calls = []
    graphed = Engine(target, head, tree, max_len=64, max_batch=4, cuda_graphs=True, graph_capture=counting(calls))
    calls.clear()  # capture itself replays nothing
    got = [graphed.generate_batch(PROMPTS, params), graphed.generate_batch(PROMPTS[:1], params)]
    for w, g in zip(want, got):
        assert [r.tokens for r in g] == [r.tokens for r in w]
        assert [r.accepted for r in g] == [r.accepted for r in w]  # the same drafts were accepted
    n = 1 if tree is None else tree.num_draft_tokens
    assert (4, n) in calls and (1, n) in calls  # 3 running rows padded to the 4-row bucket; then 1 row
    if tree is not None:
        assert ("loop", 4) in calls and ("loop", 1) in calls  # the whole draft loop replayed too


def test_an_eager_draft_beside_a_graphed_target_equals_eager(target):
    """draft_graphs=False (vLLM's enforce_eager in its speculative config): the target's verify steps replay
    graphs, the draft runs eagerly, and the output and acceptances are the eager engine's."""
    head, tree = random_head(target.config, seed=1), TreeConfig(3, 3, 8)
    params = SamplingParams(max_new_tokens=12)
    want = Engine(target, head, tree, max_len=64, max_batch=4, cuda_graphs=False).generate_batch(PROMPTS, params)
    calls = []
    engine = Engine(target, head, tree, max_len=64, max_batch=4, cuda_graphs=True, graph_capture=counting(calls),
                    draft_graphs=False)
    assert engine.runner.target_graphs is not None
    assert engine.runner.draft_graphs is None and engine.runner.draft_loop is None
    calls.clear()
    got = engine.generate_batch(PROMPTS, params)
    assert [r.tokens for r in got] == [r.tokens for r in want] and [r.accepted for r in got] == [r.accepted
                                                                                                 for r in want]
    assert (4, tree.num_draft_tokens) in calls and not any(c[0] == "loop" for c in calls)


def test_graphed_sampled_chain_equals_eager(target):
    """The draft loop of a sampled chain (noise and 1 / T as graph inputs, the draft's log-probs as an output)
    replays what the eager loop draws, from the same generator."""
    head, tree = random_head(target.config, seed=1), TreeConfig(4, 1, 5)
    params = SamplingParams(temperature=0.8, max_new_tokens=12)
    runs = []
    for graphs in (False, True):
        calls = []
        engine = Engine(target, head, tree, max_len=64, max_batch=4, cuda_graphs=graphs, sample_draft=True,
                        graph_capture=counting(calls) if graphs else None)
        calls.clear()
        runs.append(engine.generate_batch(PROMPTS, params, generator=torch.Generator().manual_seed(4)))
    assert [r.tokens for r in runs[1]] == [r.tokens for r in runs[0]]
    assert [r.accepted for r in runs[1]] == [r.accepted for r in runs[0]]
    assert ("loop", 4) in calls


@pytest.mark.parametrize("tree", [None, TreeConfig(3, 2, 6)], ids=["lookup-alone", "tree+lookup"])
def test_graphed_lookup_branch_equals_eager(target, tree):
    """A round with a lookup branch verifies num_draft_tokens + lookup tokens: its own graph bucket."""
    head = None if tree is None else random_head(target.config, seed=1)
    prompts = [p * 3 for p in PROMPTS]  # repeated text: the lookup finds matches from the first round on
    params, lookup = SamplingParams(max_new_tokens=12), LookupConfig(4)
    eager = Engine(target, head, tree, max_len=96, max_batch=4, cuda_graphs=False, lookup=lookup)
    want = eager.generate_batch(prompts, params)
    calls = []
    graphed = Engine(target, head, tree, max_len=96, max_batch=4, cuda_graphs=True, graph_capture=counting(calls),
                     lookup=lookup)
    calls.clear()
    got = graphed.generate_batch(prompts, params)
    assert [r.tokens for r in got] == [r.tokens for r in want]
    assert [r.accepted for r in got] == [r.accepted for r in want]
    assert (4, (1 if tree is None else tree.num_draft_tokens) + lookup.num_tokens) in calls
    assert sum(r.from_lookup for r in got) > 0
