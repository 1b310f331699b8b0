"""Each generated token's log-probability (and the likeliest tokens beside it) is the target's raw log-softmax
at the position it was chosen at: with a chain, a tree, a lookup branch or no draft, greedy or sampled, in a
ragged batch that finishes at different steps, the engine reports what one transformers forward over the
prompt and the generation gives, token for token, and nothing for the tokens a stop cut away. A prompt's own
tokens' log-probs (vLLM's prompt_logprobs) are that forward's too, read chunk by chunk from the prefill."""
import pytest
import torch

from test_engine_edges import DRAFTS, LENGTHS, PROMPTS, hf_greedy, make_head, tiny  # noqa: F401 (fixture)
from toolkit.infer.engine import Engine
from toolkit.infer.graphs import eager_capture
from toolkit.infer.logprobs import prompt_logprobs, token_logprobs
from toolkit.infer.sampling import SamplingParams
from toolkit.infer.sequence import Sequence

TOP = 3


@torch.no_grad()
def reference(hf, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """transformers' log-softmax [n, V] at the positions that chose tokens [n]."""
    logits = hf(torch.tensor([prompt + tokens])).logits[0].float()
    return logits.log_softmax(-1)[len(prompt) - 1:len(prompt) - 1 + len(tokens)]


def check(result, hf, prompt, top) -> None:
    assert [lp.token for lp in result.logprobs] == result.tokens  # one entry per token, stops included
    want = reference(hf, prompt, result.tokens)
    got = torch.tensor([lp.logprob for lp in result.logprobs])
    assert torch.allclose(got, want.gather(-1, torch.tensor(result.tokens)[:, None])[:, 0], atol=1e-4)
    for lp, row in zip(result.logprobs, want):
        assert len(lp.top) == top
        if top:
            values, ids = row.topk(top)
            assert [i for i, _ in lp.top] == ids.tolist()
            assert torch.allclose(torch.tensor([v for _, v in lp.top]), values, atol=1e-4)


@pytest.mark.parametrize("draft, graphs", [("plain", False), ("oracle-chain", False), ("oracle-tree", False),
                                           ("eagle3-tree", False), ("eagle3-tree", True), ("mtp-chain", False),
                                           ("lookup", False), ("oracle-tree+lookup", False)])
def test_greedy_logprobs_are_the_targets_at_each_emitted_token(tiny, draft, graphs):
    target, hf = tiny
    kind, tree, lookup = DRAFTS[draft]
    head = None if kind is None else make_head(kind, target, [p + hf_greedy(hf, p, 24) for p in PROMPTS])
    stop = hf_greedy(hf, PROMPTS[4], 24)[6]  # one sequence stops on a stop id, maybe inside an accepted run
    kw = {"cuda_graphs": True, "graph_capture": eager_capture} if graphs else {}  # the graphs' logits buffer
    eng = Engine(target, head, tree, max_len=64, max_batch=len(PROMPTS), lookup=lookup, **kw)
    # every other sequence asks for none: it gets none, and the others' are unaffected by sharing the batch
    seqs = [Sequence(p, SamplingParams(max_new_tokens=n, logprobs=None if i % 2 else TOP), frozenset({stop}))
            for i, (p, n) in enumerate(zip(PROMPTS, LENGTHS))]
    eng.admit(seqs)
    while eng.running:
        eng.step()
    for i, (s, p) in enumerate(zip(seqs, PROMPTS)):
        assert s.result.tokens == hf_greedy(hf, p, len(s.result.tokens))
        if i % 2:
            assert s.result.logprobs == []
        else:
            check(s.result, hf, p, TOP)
    if kind == "oracle":
        assert max(a for s in seqs for a in s.result.accepted) >= 3  # runs of drafts were accepted


@pytest.mark.parametrize("draft", ["plain", "eagle3-tree", "mtp-chain"])
def test_sampled_logprobs_are_raw_not_tempered(tiny, draft):
    """At temperature 0.7 with top-k, the figures are still the raw distribution's (vLLM's default), and
    logprobs 0 lists no alternatives."""
    target, hf = tiny
    kind, tree, lookup = DRAFTS[draft]
    head = None if kind is None else make_head(kind, target)
    eng = Engine(target, head, tree, max_len=64, max_batch=2, lookup=lookup)
    params = SamplingParams(temperature=0.7, top_k=20, max_new_tokens=12, logprobs=0)
    prompts = [PROMPTS[1], PROMPTS[3]]
    results = eng.generate_batch(prompts, params, generator=torch.Generator().manual_seed(5))
    for r, p in zip(results, prompts):
        check(r, hf, p, 0)


@pytest.mark.parametrize("draft", ["plain", "eagle3-tree", "eagle2-chain"])
def test_prompt_logprobs_are_the_targets_over_the_prompt(tiny, draft):
    """Prompts of 1..45 tokens prefilled as one ragged batch (the EAGLE-2 head reads the final hidden state
    itself): each prompt token after the first gets the log-prob, rank and likeliest tokens that transformers
    gives it; a sequence that asks for none gets none, and the generation is unchanged."""
    target, hf = tiny
    kind, tree, lookup = DRAFTS[draft]
    eng = Engine(target, None if kind is None else make_head(kind, target), tree, max_len=64, max_batch=len(PROMPTS))
    seqs = [Sequence(p, SamplingParams(max_new_tokens=n, prompt_logprobs=None if i == 2 else i % 3))
            for i, (p, n) in enumerate(zip(PROMPTS, LENGTHS))]
    eng.admit(seqs)
    while eng.running:
        eng.step()
    for i, (s, p) in enumerate(zip(seqs, PROMPTS)):
        assert s.result.tokens == hf_greedy(hf, p, LENGTHS[i])
        if i == 2:
            assert s.result.prompt_logprobs == []
            continue
        assert [lp.token for lp in s.result.prompt_logprobs] == p[1:]
        with torch.no_grad():
            want = hf(torch.tensor([p])).logits[0, :-1].float().log_softmax(-1)                  # [L - 1, V]
        for lp, row, t in zip(s.result.prompt_logprobs, want, p[1:]):
            assert lp.logprob == pytest.approx(float(row[t]), abs=1e-4) and lp.rank == int((row > row[t]).sum()) + 1
            assert [i for i, _ in lp.top] == row.topk(i % 3).indices.tolist()


def test_prompt_logprobs_read_in_chunks_equal_one_read():
    torch.manual_seed(0)
    lm_head, normed, prompt = torch.randn(50, 8), torch.randn(11, 8), torch.randint(0, 50, (11,)).tolist()
    whole = prompt_logprobs(lambda h: h @ lm_head.T, normed, prompt, top=2)
    chunked = prompt_logprobs(lambda h: h @ lm_head.T, normed, prompt, top=2, chunk=3)
    assert [(c.token, c.rank, [i for i, _ in c.top]) for c in chunked] == [(w.token, w.rank, [i for i, _ in w.top])
                                                                          for w in whole]
    assert [c.logprob for c in chunked] == pytest.approx([w.logprob for w in whole], abs=1e-5)
    assert len(whole) == 10 and prompt_logprobs(lambda h: h @ lm_head.T, normed[:1], prompt[:1], 2) == []


def test_token_logprobs_lists_the_likeliest_first():
    logits = torch.tensor([[0.0, 2.0, 1.0, -1.0], [3.0, 0.5, 0.0, -1.0]])
    out = token_logprobs(logits, [3, 0], top=2)
    logp = logits.log_softmax(-1)
    assert [o.token for o in out] == [3, 0]
    assert out[0].logprob == pytest.approx(float(logp[0, 3])) and out[1].logprob == pytest.approx(float(logp[1, 0]))
    assert [i for i, _ in out[0].top] == [1, 2] and [i for i, _ in out[1].top] == [0, 1]
    assert [o.rank for o in out] == [4, 1]
    assert token_logprobs(logits, [1], top=9)[0].top[-1][0] == 3  # more than the vocabulary: all of it


def test_negative_logprobs_are_refused():
    with pytest.raises(ValueError, match="logprobs must be >= 0"):
        SamplingParams(logprobs=-1)
    with pytest.raises(ValueError, match="prompt_logprobs must be >= 0"):
        SamplingParams(prompt_logprobs=-1)
