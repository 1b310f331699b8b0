"""Logit bias, repetition / frequency / presence penalties and min-p: greedy speculative output equals plain decoding and a
transformers loop that applies the penalties by hand, for chains, trees and a lookup branch whose draft paths
repeat tokens (each node is penalized with its own path's counts); sampled, the first tokens are distributed as
without speculation, and as the penalized, min-p-cut law computed directly. min_tokens holds the stop ids back
exactly as transformers' min_new_tokens does, node by node at each node's depth."""
import math
from collections import Counter

import pytest
import torch
from transformers.generation.logits_process import MinNewTokensLengthLogitsProcessor, RepetitionPenaltyLogitsProcessor

from test_engine_edges import DRAFTS, Oracle, make_head, tiny  # noqa: F401 (fixture)
from test_engine_sampling import PROMPT, chi2, draws, limit
from test_engine_sampling import tiny as tiny8  # noqa: F401 (fixture)
from toolkit.infer.drafts import random_head
from toolkit.infer.engine import Engine
from toolkit.infer.lookup import LookupConfig
from toolkit.infer.penalties import Penalties
from toolkit.infer.sampling import SamplingParams
from toolkit.infer.sequence import Sequence
from toolkit.infer.tree import Tree, TreeConfig

PENALIZED = SamplingParams(max_new_tokens=20, repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.3)
BIASED = SamplingParams(max_new_tokens=20, logit_bias=((5, 4.0), (40, -100.0)), frequency_penalty=0.5)
PROMPTS = [[1, 5, 9, 13], [7, 7, 7, 7], [40, 41, 42, 40, 41, 42, 40]]


def penalize(scores: torch.Tensor, context: list[int], output: list[int], p: SamplingParams) -> torch.Tensor:
    """The reference: the bias, transformers' repetition processor over prompt + output, then OpenAI's two."""
    for t, bias in p.logit_bias:
        scores[t] += bias
    scores = RepetitionPenaltyLogitsProcessor(p.repetition_penalty)(torch.tensor([context]), scores[None])[0]
    counts = Counter(output)
    for t, c in counts.items():
        scores[t] -= p.frequency_penalty * c + p.presence_penalty
    return scores


@torch.no_grad()
def reference_greedy(hf, prompt: list[int], p: SamplingParams) -> list[int]:
    out: list[int] = []
    for _ in range(p.max_new_tokens):
        logits = hf(torch.tensor([prompt + out])).logits[0, -1].float()
        out.append(int(penalize(logits, prompt + out, out, p).argmax()))
    return out


@pytest.mark.parametrize("params", [PENALIZED, BIASED], ids=["penalties", "logit_bias"])
@pytest.mark.parametrize("draft", ["plain", "oracle-chain", "oracle-tree", "eagle3-tree", "mtp-chain", "lookup",
                                   "oracle-tree+lookup"])
def test_greedy_with_penalties_equals_the_reference(tiny, draft, params):
    target, hf = tiny
    want = [reference_greedy(hf, p, params) for p in PROMPTS]
    unpenalized = [reference_greedy(hf, p, SamplingParams(max_new_tokens=20)) for p in PROMPTS]
    assert want != unpenalized  # the penalties change this model's greedy text
    kind, tree, lookup = DRAFTS[draft]
    # the oracle knows the penalized continuation, so long draft paths are accepted and penalized node by node
    head = None if kind is None else (Oracle.of(target, [p + w for p, w in zip(PROMPTS, want)], wrong_every=4)
                                      if kind == "oracle" else make_head(kind, target))
    eng = Engine(target, head, tree, max_len=64, max_batch=len(PROMPTS), lookup=lookup)
    results = eng.generate_batch(PROMPTS, params)
    assert [r.tokens for r in results] == want
    if kind == "oracle":
        assert max(a for r in results for a in r.accepted) >= 3


@torch.no_grad()
def reference_min_tokens(hf, prompt: list[int], stops: set[int], p: SamplingParams) -> list[int]:
    """Greedy with transformers' min_new_tokens processor over the stop ids, stopping at a stop id."""
    rule, out = MinNewTokensLengthLogitsProcessor(len(prompt), p.min_tokens, sorted(stops)), []
    while len(out) < p.max_new_tokens and not (out and out[-1] in stops):
        logits = hf(torch.tensor([prompt + out])).logits[0, -1:].float()
        out.append(int(rule(torch.tensor([prompt + out]), logits)[0].argmax()))
    return out


@pytest.mark.parametrize("draft", ["plain", "oracle-chain", "oracle-tree", "eagle3-tree", "mtp-chain", "lookup",
                                   "oracle-tree+lookup"])
def test_min_tokens_holds_the_stop_ids_back_as_transformers_does(tiny, draft):
    target, hf = tiny
    plain = [reference_greedy(hf, p, SamplingParams(max_new_tokens=20)) for p in PROMPTS]
    stops = {out[i] for out in plain for i in (1, 4)}  # each prompt would stop by its 5th token
    kind, tree, lookup = DRAFTS[draft]
    for m in (3, 6, 9):  # the stop just past m falls at different depths of the steps' trees
        params = SamplingParams(max_new_tokens=20, min_tokens=m)
        want = [reference_min_tokens(hf, p, stops, params) for p in PROMPTS]
        assert all(len(w) > m for w in want) and any(w[-1] in stops for w in want)  # stopped late, or ran out
        head = None if kind is None else (Oracle.of(target, [p + w for p, w in zip(PROMPTS, want)], wrong_every=5)
                                          if kind == "oracle" else make_head(kind, target))
        eng = Engine(target, head, tree, max_len=64, max_batch=len(PROMPTS), lookup=lookup)
        assert [r.tokens for r in eng.generate_batch(PROMPTS, params, stop_ids=stops)] == want, m
    early = eng.generate_batch(PROMPTS, SamplingParams(max_new_tokens=20), stop_ids=stops)
    assert all(len(r.tokens) <= 5 and r.finish == "stop" for r in early)  # without it they stop at once


@torch.no_grad()
def reference_banned(hf, prompt: list[int], p: SamplingParams) -> list[int]:
    """Greedy with vLLM's allowed_token_ids and bad_words rules applied by hand (the output is the context)."""
    out: list[int] = []
    for _ in range(p.max_new_tokens):
        logits = hf(torch.tensor([prompt + out])).logits[0, -1].float()
        if p.allowed_token_ids:
            keep = torch.zeros_like(logits, dtype=torch.bool)
            keep[list(p.allowed_token_ids)] = True
            logits[~keep] = float("-inf")
        for w in p.bad_words:
            if len(w) == 1 or (len(out) >= len(w) - 1 and out[len(out) - len(w) + 1:] == list(w[:-1])):
                logits[w[-1]] = float("-inf")
        out.append(int(logits.argmax()))
    return out


@pytest.mark.parametrize("draft", ["plain", "oracle-chain", "oracle-tree", "eagle3-tree", "mtp-chain", "lookup",
                                   "oracle-tree+lookup"])
def test_bad_words_and_allowed_ids_as_vllm_rules_them(tiny, draft):
    """A two-token word banned where its first token ends the output (node by node: a draft path may complete
    it), a three-token one, a one-token one, and an allowed-ids list; greedy equals the hand-applied rules."""
    target, hf = tiny
    plain = [reference_greedy(hf, p, SamplingParams(max_new_tokens=20)) for p in PROMPTS]
    words = ((plain[0][3], plain[0][4]), (plain[1][2], plain[1][3], plain[1][4]), (plain[2][5],))
    cases = [SamplingParams(max_new_tokens=20, bad_words=words),
             SamplingParams(max_new_tokens=20, allowed_token_ids=tuple(range(1, 64, 3)), bad_words=words[2:])]
    kind, tree, lookup = DRAFTS[draft]
    for params in cases:
        want = [reference_banned(hf, p, params) for p in PROMPTS]
        assert want != plain
        head = None if kind is None else (Oracle.of(target, [p + w for p, w in zip(PROMPTS, want)], wrong_every=4)
                                          if kind == "oracle" else make_head(kind, target))
        eng = Engine(target, head, tree, max_len=64, max_batch=len(PROMPTS), lookup=lookup)
        assert [r.tokens for r in eng.generate_batch(PROMPTS, params)] == want


def test_a_bad_word_is_banned_only_at_nodes_whose_path_completes_it():
    """The output so far is 3, 4 (4 the root); the word (4, 5, 6): node 1's path makes it 4, 5, so 6 is banned after
    it; the root (3, 4) and node 2 (4, 7) ban nothing."""
    pen = Penalties(SamplingParams(bad_words=((4, 5, 6),)), [9], 10, torch.device("cpu"))
    pen.add(3)
    pen.add(4)  # the root
    tree = Tree(torch.tensor([4, 5, 7]), torch.tensor([-1, 0, 0]), torch.tensor([0, 1, 1]))
    out = pen.apply(torch.zeros(3, 10), tree.tokens, tree.ancestor_mask())
    assert out[1, 6] == -math.inf and out[0, 6] == 0 and out[2, 6] == 0 and out.isinf().sum() == 1


def test_min_tokens_masks_a_node_by_its_depth():
    """Two tokens are out, min_tokens 4: the stop id 3 is masked at the root (the 3rd token) and at depth 1
    (the 4th), free at depth 2 (the 5th)."""
    pen = Penalties(SamplingParams(min_tokens=4), [9], 10, torch.device("cpu"), frozenset({3}))
    pen.add(4)
    pen.add(5)  # the root
    tree = Tree(torch.tensor([5, 6, 7, 8]), torch.tensor([-1, 0, 0, 1]), torch.tensor([0, 1, 1, 2]))
    out = pen.apply(torch.zeros(4, 10), tree.tokens, tree.ancestor_mask())
    assert out[:, 3].tolist() == [-math.inf, -math.inf, -math.inf, 0] and out[:, [0, 1, 2, 4]].eq(0).all()


def test_each_tree_node_counts_its_own_path():
    """Node 3 follows 0 -> 1 -> 3 (tokens 5, 6): it is penalized for 5 and 6, not for node 2's 7."""
    p = SamplingParams(frequency_penalty=1.0)
    pen = Penalties(p, [9], 10, torch.device("cpu"))
    pen.add(4)  # the root, already in the output
    tree = Tree(torch.tensor([4, 5, 7, 6]), torch.tensor([-1, 0, 0, 1]), torch.tensor([0, 1, 1, 2]))
    out = pen.apply(torch.zeros(4, 10), tree.tokens, tree.ancestor_mask())
    assert out[3].tolist() == [0, 0, 0, 0, -1, -1, -1, 0, 0, 0]
    assert out[2].tolist() == [0, 0, 0, 0, -1, 0, 0, -1, 0, 0] and out[0].tolist()[4] == -1
    rep = Penalties(SamplingParams(repetition_penalty=2.0), [9], 10, torch.device("cpu"))
    assert rep.apply(torch.tensor([[2.0] * 5 + [-2.0] * 5]))[0].tolist() == [2.0] * 5 + [-2.0] * 4 + [-4.0]


SAMPLED = {  # tree, params, sampled drafts, lookup
    "tree-penalties": (TreeConfig(3, 2, 6), SamplingParams(temperature=1.0, max_new_tokens=3, repetition_penalty=1.6,
                                                           frequency_penalty=0.5), False, None),
    "sampled-chain-presence-min_p": (TreeConfig(3, 1, 4), SamplingParams(temperature=1.2, max_new_tokens=3,
                                                                         presence_penalty=0.8, min_p=0.1), True, None),
    "chain+lookup-min_p-top_p": (TreeConfig(2, 1, 3), SamplingParams(temperature=1.0, max_new_tokens=3, min_p=0.2,
                                                                     top_p=0.9, repetition_penalty=1.4), False,
                                 LookupConfig(3, 2)),
}


@torch.no_grad()
def exact_law(target, p: SamplingParams) -> dict:
    """P(first two tokens) under the penalized, tempered, min-p / top-p cut law, computed directly."""
    def law(out):
        logits = penalize(target(torch.tensor([PROMPT + out]))[0][0, -1].float(), PROMPT + out, out, p) / p.temperature
        probs = logits.softmax(-1)
        probs[probs < p.min_p * probs.max()] = 0
        if p.top_p < 1:
            ranked, order = probs.sort(descending=True, stable=True)
            drop = (ranked / ranked.sum()).cumsum(0) - ranked / ranked.sum() >= p.top_p
            probs[order[drop]] = 0
        return probs / probs.sum()
    first = law([])
    return {(a, b): float(first[a]) * float(q) for a in range(len(first)) if first[a] > 0
            for b, q in enumerate(law([a]).tolist()) if q > 0}


@pytest.mark.parametrize("case", list(SAMPLED))
def test_sampled_with_penalties_and_min_p_is_lossless(tiny8, case):
    tree, params, sample_draft, lookup = SAMPLED[case]
    plain = draws(Engine(tiny8, max_len=32, max_batch=250), params, 0)
    spec = draws(Engine(tiny8, random_head(tiny8.config, seed=2), tree, max_len=32, max_batch=250,
                        sample_draft=sample_draft, lookup=lookup), params, 1)
    for i in range(1, params.max_new_tokens):
        for part in (slice(i, i + 1), slice(i - 1, i + 1)):
            stat, df = chi2(Counter(s[part] for s in plain), Counter(s[part] for s in spec))
            assert stat < limit(df), (f"tokens {part.start + 1}..{part.stop}", stat, df)
    want = exact_law(tiny8, params)  # and plain sampling draws from the law the reference computes
    seen = Counter(s[:2] for s in plain)
    assert set(seen) <= set(want)  # nothing the cut law excludes
    stat = sum((seen[k] - len(plain) * q) ** 2 / (len(plain) * q) for k, q in want.items())
    assert stat < limit(len(want) - 1), (stat, len(want))


def test_sampled_with_min_tokens_is_lossless(tiny8):
    """Stop id 3 (a likely token here) is held back for two tokens: never before the third, and the sequences,
    ended or not, are distributed as without speculation. The wide tree has every token as a child of the root,
    so the first step always accepts one and picks the third token at depth 1, where 3 is allowed again."""
    params, stops = SamplingParams(temperature=1.0, max_new_tokens=4, min_tokens=2), frozenset({3})

    def sample(engine, seed):
        g = torch.Generator().manual_seed(seed)
        return [tuple(r.tokens) for _ in range(16) for r in engine.generate_batch([PROMPT] * 250, params, stops, g)]

    plain = sample(Engine(tiny8, max_len=32, max_batch=250), 0)
    spec = sample(Engine(tiny8, random_head(tiny8.config, seed=2), TreeConfig(2, 8, 17), max_len=32, max_batch=250), 1)
    for run in (plain, spec):
        assert all(3 not in s[:2] for s in run) and sum(s[2:3] == (3,) for s in run) > 200
    stat, df = chi2(Counter(s[:3] for s in plain), Counter(s[:3] for s in spec))  # a stop or not at the 3rd
    assert stat < limit(df), (stat, df)


def test_a_bias_outside_the_vocabulary_is_refused_before_any_prefill(tiny):
    target, _ = tiny
    with pytest.raises(ValueError, match="logit_bias names token id 64, outside the vocabulary 0..63"):
        Engine(target, max_len=32).generate([1, 2], SamplingParams(max_new_tokens=2, logit_bias=((64, 1.0),)))


@pytest.mark.parametrize("kw, message", [({"repetition_penalty": 0}, "repetition_penalty must be"),
                                         ({"logit_bias": ((3, 101.0),)}, "logit_bias takes"),
                                         ({"presence_penalty": 2.5}, "presence_penalty must be"),
                                         ({"frequency_penalty": -3}, "frequency_penalty must be"),
                                         ({"min_p": 1.5}, "min_p must be"),
                                         ({"min_tokens": 300}, r"min_tokens must be in \[0, max_new_tokens = 256\]"),
                                         ({"min_tokens": -1}, "min_tokens must be"),
                                         ({"allowed_token_ids": (-1,)}, "allowed_token_ids must be"),
                                         ({"bad_words": ((),)}, "bad_words must be"),
                                         ({"repetition_penalty": math.inf}, "repetition_penalty must be")])
def test_bad_values_are_refused(kw, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kw)


NAMED = "output token {}: together, the request's allowed_token_ids and {} allow none"
STUCK = {  # params -> (tokens they let out, what the error says)
    "at the first token": (SamplingParams(max_new_tokens=20, allowed_token_ids=(5,), bad_words=((5,),)), [],
                           NAMED.format(0, "bad_words")),
    "after one token": (SamplingParams(max_new_tokens=20, allowed_token_ids=(5, 6), bad_words=((6,), (5, 5))), [5],
                        NAMED.format(1, "bad_words")),
    "min_tokens over the only ids allowed": (SamplingParams(max_new_tokens=20, allowed_token_ids=(2,), min_tokens=3),
                                             [], NAMED.format(0, "min_tokens")),
}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("draft", ["plain", "oracle-tree", "eagle3-tree", "mtp-chain", "lookup"])
def test_constraints_that_allow_no_token_end_that_sequence_alone(tiny, draft, temperature):
    """Where a request's constraints leave no token at all (the first, or one a tree node would need), that
    sequence ends there with finish "abort" and an error naming them; nothing is made up (an argmax over -inf
    picked token 0, a sample over them failed the whole batch step), and the batch beside it goes on as alone."""
    target, hf = tiny
    free = SamplingParams(max_new_tokens=20, temperature=temperature)
    want = reference_greedy(hf, PROMPTS[0], free) if temperature == 0 else None
    kind, tree, lookup = DRAFTS[draft]
    head = None if kind is None else (Oracle.of(target, [PROMPTS[0] + (want or [])], wrong_every=4)
                                      if kind == "oracle" else make_head(kind, target))
    eng = Engine(target, head, tree, max_len=64, max_batch=4, lookup=lookup)
    stuck = [Sequence(PROMPTS[1], params, frozenset({2}), generator=torch.Generator().manual_seed(0))
             for params, _, _ in STUCK.values()]
    beside = Sequence(PROMPTS[0], free, frozenset({2}), generator=torch.Generator().manual_seed(1))
    eng.admit([stuck[0], beside, *stuck[1:]])
    while eng.running:
        eng.step()
    for s, (_, tokens, named) in zip(stuck, STUCK.values()):
        assert (s.result.tokens, s.result.finish, s.done) == (tokens, "abort", True)
        assert named in s.result.error
    assert beside.result.finish == "length" and beside.result.error is None
    if want is not None:
        assert beside.result.tokens == want
    for s in stuck:  # a step that found no token still counts: it accepted no draft token
        assert min(s.result.accepted, default=0) >= 0 and len(s.result.accepted) == s.result.verify_steps


@pytest.mark.parametrize("draft", ["plain", "eagle3-tree", "mtp-chain", "lookup"])
def test_extreme_accepted_values_sample_and_leave_the_batch_alone(tiny, draft):
    """A repetition penalty near 0 divided seen tokens' logits past float32 (inf, then NaN in softmax) and a top_p
    below float32's smallest (read as 0) dropped every token: torch.multinomial failed the step of every request
    in the batch (a 500 for each). Both sample now, from the one likeliest token where the law collapses."""
    target, _ = tiny
    kind, tree, lookup = DRAFTS[draft]
    head = None if kind is None else make_head(kind, target)
    free = SamplingParams(max_new_tokens=12, temperature=1.0)
    extreme = [SamplingParams(max_new_tokens=12, temperature=1.0, repetition_penalty=1e-38),
               SamplingParams(max_new_tokens=12, temperature=1.0, top_p=1e-300),
               SamplingParams(max_new_tokens=12, temperature=0.5, repetition_penalty=1e-38, top_p=1e-46)]
    alone = Engine(target, head, tree, max_len=64, max_batch=1, lookup=lookup).generate(
        PROMPTS[0], free, frozenset({2}), torch.Generator().manual_seed(1))
    eng = Engine(target, head, tree, max_len=64, max_batch=4, lookup=lookup)
    seqs = [Sequence(PROMPTS[2], p, frozenset({2}), generator=torch.Generator().manual_seed(0)) for p in extreme]
    beside = Sequence(PROMPTS[0], free, frozenset({2}), generator=torch.Generator().manual_seed(1))
    eng.admit([*seqs, beside])
    while eng.running:
        eng.step()
    for s in seqs:
        assert s.result.error is None and len(s.result.tokens) == 12, (s.result.finish, s.result.error)
    assert beside.result.tokens == alone.tokens
    # top_p that small is the argmax of what is left: the same tokens as greedy decoding
    greedy = Engine(target, max_len=64, max_batch=1).generate(PROMPTS[2], SamplingParams(max_new_tokens=12),
                                                              frozenset({2}))
    assert seqs[1].result.tokens == greedy.tokens


def test_target_probs_stay_a_distribution_at_the_limits():
    from toolkit.infer.sampling import target_probs

    logits = torch.tensor([[3.0e38, float("inf"), 1.0, float("-inf")], [2.0, 1.0, 0.5, 0.1]])
    for p in (SamplingParams(temperature=1e-4), SamplingParams(temperature=1.0, top_p=1e-300),
              SamplingParams(temperature=2.0, top_k=2, min_p=0.5)):
        probs = target_probs(logits, p)
        assert torch.isfinite(probs).all() and torch.allclose(probs.sum(-1), torch.ones(2)), (p, probs)
        assert probs[0, 3] == 0
    assert target_probs(logits, SamplingParams(temperature=1.0, top_p=1e-300))[1].tolist() == [1.0, 0, 0, 0]
