"""Tree verification: greedy follows the target argmax; sampling emits exactly the target distribution, with
top-1 proposals and with a chain the draft sampled (there also accepting sum min(p, q) of the time)."""
from collections import Counter

import pytest
import torch

from toolkit.infer.sampling import SamplingParams, target_probs
from toolkit.infer.verify import greedy_verify, sample_chain_verify, sample_verify


def test_greedy_walks_the_matching_branch_and_adds_the_bonus():
    #            root  a   b   c   d   e
    tokens = torch.tensor([7, 3, 5, 1, 4, 2])
    parents = torch.tensor([-1, 0, 0, 1, 2, 2])  # a, b under root; c under a; d, e under b
    logits = torch.zeros(6, 8)
    logits[0, 5] = logits[2, 2] = logits[5, 6] = 1  # root -> b(5), b -> e(2), e -> bonus 6
    path, out = greedy_verify(tokens, parents, logits)
    assert path == [0, 2, 5] and out == [5, 2, 6]
    logits[0] = 0
    logits[0, 0] = 1  # the target wants a token no child has: nothing accepted, bonus only
    assert greedy_verify(tokens, parents, logits) == ([0], [0])


def test_greedy_emits_what_plain_greedy_would_on_random_trees():
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        n, v = 12, 4
        parents = torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n + 1)])
        tokens = torch.randint(0, v, (n + 1,), generator=g)
        logits = torch.randn(n + 1, v, generator=g)
        path, out = greedy_verify(tokens, parents, logits)
        assert len(out) == len(path)
        for i, node in enumerate(path):
            assert out[i] == int(logits[node].argmax())  # each emitted token is the target's choice
            if i + 1 < len(path):
                assert parents[path[i + 1]] == node and tokens[path[i + 1]] == out[i]


def tv(counts: Counter, probs: torch.Tensor) -> float:
    n = sum(counts.values())
    return 0.5 * sum(abs(counts.get(t, 0) / n - float(probs[t])) for t in range(len(probs)))


@pytest.mark.parametrize("shape", ["tree", "chain"])
def test_sampling_is_lossless(shape):
    """First token ~ the root's target distribution; second token, given the first was a draft child,
    ~ that child's target distribution; whatever the draft proposes."""
    g = torch.Generator().manual_seed(1)
    v = 6
    if shape == "tree":  # root -> candidates 2, 0, 4 (draft's top-3); under the first: 1, 3
        tokens, parents = torch.tensor([5, 2, 0, 4, 1, 3]), torch.tensor([-1, 0, 0, 0, 1, 1])
    else:
        tokens, parents = torch.tensor([5, 2, 1, 3]), torch.tensor([-1, 0, 1, 2])
    logits = torch.randn(len(tokens), v, generator=g) * 1.5
    probs = target_probs(logits, SamplingParams(temperature=0.8, top_k=5))
    first, second = Counter(), Counter()
    n = 40_000
    for _ in range(n):
        path, out = sample_verify(tokens, parents, probs, g)
        first[out[0]] += 1
        if len(path) > 1 and path[1] == 1:
            second[out[1]] += 1
    assert tv(first, probs[0]) < 0.012
    assert sum(second.values()) > 3000 and tv(second, probs[1]) < 0.03
    assert first[[t for t in range(v) if probs[0][t] == 0][0]] == 0  # top-k removed it: never emitted


def test_sampled_chain_verify_is_lossless_and_accepts_sum_min_p_q():
    """Drafts drawn from q at every node: the first emitted token ~ p[0]; given node 1 accepted, the next ~ p[1];
    node 1 is accepted with probability sum_x min(p[0](x), q[0](x))."""
    g = torch.Generator().manual_seed(2)
    v, n = 6, 40_000
    logits = torch.randn(4, v, generator=g) * 1.5
    probs = target_probs(logits, SamplingParams(temperature=0.9, top_k=5))             # [4, v]: root + 3 nodes
    draft = (torch.randn(3, v, generator=g) * 1.5).softmax(-1)                         # q of nodes 1..3
    first, second, accepted = Counter(), Counter(), 0
    for _ in range(n):
        tokens = torch.cat([torch.tensor([5]), torch.multinomial(draft, 1, generator=g)[:, 0]])
        path, out = sample_chain_verify(tokens, probs, draft, g)
        assert len(out) == len(path) and path == list(range(len(path)))
        assert out[:len(path) - 1] == tokens[1:len(path)].tolist()   # accepted nodes emit their own tokens
        first[out[0]] += 1
        if len(path) > 1:
            accepted += 1
            second[out[1]] += 1
    assert tv(first, probs[0]) < 0.012
    assert tv(second, probs[1]) < 0.02
    assert abs(accepted / n - float(torch.minimum(probs[0], draft[0]).sum())) < 0.01
    assert first[[t for t in range(v) if probs[0][t] == 0][0]] == 0  # top-k removed it: never emitted
    chain = torch.tensor([5, int(probs[0].argmax()), int(probs[1].argmax())])
    same = sample_chain_verify(chain, probs[:3], probs[:2], g)                      # q == p: always accepted
    assert same[0] == [0, 1, 2] and same[1][:2] == chain[1:].tolist()


def test_target_probs_and_params():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
    assert target_probs(logits, SamplingParams()).tolist() == [[1.0, 0.0, 0.0, 0.0]]
    p = target_probs(logits, SamplingParams(temperature=1.0, top_p=0.7))
    full = logits.softmax(-1)[0]
    assert p[0, 2:].sum() == 0 and torch.allclose(p[0, :2], full[:2] / full[:2].sum())  # 0.66 < 0.7: two kept
    assert (target_probs(logits, SamplingParams(temperature=1.0, top_k=1)) == torch.tensor([[1.0, 0, 0, 0]])).all()
    for bad in (dict(temperature=-1), dict(top_p=0), dict(top_p=1.5), dict(top_k=-2), dict(max_new_tokens=0)):
        with pytest.raises(ValueError):
            SamplingParams(**bad)


def test_an_accepted_path_stops_at_a_node_that_allows_no_token():
    """Path 0 -> 2 -> 5, emitted tokens a b c: node 5 allows none, so its own token (b, chosen at node 2) is the
    last; node 2 allowing none ends after a; the root allowing none emits nothing (its KV kept)."""
    from toolkit.infer.verify import stop_at_empty

    path, out = [0, 2, 5], ["a", "b", "c"]
    empty = [False] * 6
    assert stop_at_empty(path, out, empty) == (path, out, False)
    assert stop_at_empty(path, out, [i == 5 for i in range(6)]) == ([0, 2], ["a", "b"], True)
    assert stop_at_empty(path, out, [i in (2, 5) for i in range(6)]) == ([0], ["a"], True)
    assert stop_at_empty(path, out, [i == 0 for i in range(6)]) == ([0], [], True)
    assert stop_at_empty(path, out, [i == 3 for i in range(6)]) == (path, out, False)  # off the path: no matter
