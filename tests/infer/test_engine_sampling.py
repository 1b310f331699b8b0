"""Sampling with speculation is lossless: on a tiny random model, the first generated tokens (each one, and
each consecutive pair) are distributed the same with a draft tree or chain as without speculation, under
temperature, top-k and top-p; and no token the target's truncated distribution excludes is ever emitted.

The sampled chain draws its drafts from the head (speculative sampling verifies them against the draft's law).
Token 1 comes from prefill (the draft plays no part); tokens 2 and 3 come from the first verify step (an
accepted draft token or the bonus) or the second; in the wide tree the first step always accepts a
non-first child, so token 4 also checks the KV moved for that accepted path. A prompt-lookup branch grafted
onto the chain (or alone) is one more deterministic candidate: the same law must come out."""
import math
from collections import Counter

import pytest
import torch

from toolkit.infer.drafts import random_head
from toolkit.infer.engine import Engine
from toolkit.infer.loading import load_target
from toolkit.infer.lookup import LookupConfig
from toolkit.infer.sampling import SamplingParams, target_probs
from toolkit.infer.tree import TreeConfig

PROMPT, N, BATCH = [1, 5, 2], 4000, 250


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import transformers

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: one thread is several times faster than two here

    folder = tmp_path_factory.mktemp("tiny")
    cfg = transformers.LlamaConfig(vocab_size=8, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    torch.manual_seed(3)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # a spread next-token law (the default init gives a near-uniform one, where top-k and
        model.lm_head.weight.normal_(0.0, 0.3)  # top-p cut nothing and a wrong residual hardly shows)
    model.save_pretrained(folder)
    yield load_target(folder)
    torch.set_num_threads(threads)


def chi2(a: Counter, b: Counter) -> tuple[float, int]:
    """Two-sample chi-square statistic for equal sample sizes, and its degrees of freedom."""
    keys = set(a) | set(b)
    return sum((a[k] - b[k]) ** 2 / (a[k] + b[k]) for k in keys), len(keys) - 1


def limit(df: int) -> float:
    """The chi2(df) 0.9999 quantile, by Wilson-Hilferty (a few % above the exact one: slightly conservative)."""
    df = max(df, 1)
    return df * (1 - 2 / (9 * df) + 3.719 * math.sqrt(2 / (9 * df))) ** 3


def draws(engine, params, seed) -> list[tuple]:
    """N generations of PROMPT, BATCH at a time (independent draws from one seeded generator)."""
    g, out = torch.Generator().manual_seed(seed), []
    for _ in range(N // BATCH):
        out += [tuple(r.tokens) for r in engine.generate_batch([PROMPT] * BATCH, params, generator=g)]
    return out


@torch.no_grad()
def excluded(target, samples, params) -> int:
    """Emitted tokens that the target's distribution (after temperature, top-k, top-p) gives probability 0."""
    probs, bad = {}, 0
    for sample, count in Counter(samples).items():
        for i in range(1, len(sample)):
            if sample[:i] not in probs:
                logits = target(torch.tensor([PROMPT + list(sample[:i])]))[0][0, -1]
                probs[sample[:i]] = target_probs(logits, params)
            bad += count * int(probs[sample[:i]][sample[i]] == 0)
    return bad


CASES = {  # tree, sampling, sampled drafts, lookup; the wide tree has every token as a child of the root
    "chain-top_p": (TreeConfig(2, 1, 3), SamplingParams(temperature=1.0, top_p=0.8, max_new_tokens=3), False, None),
    "wide-tree-top_k": (TreeConfig(2, 8, 17), SamplingParams(temperature=2.0, top_k=2, max_new_tokens=4), False,
                        None),
    "tree-top_k-top_p": (TreeConfig(3, 2, 6), SamplingParams(temperature=1.5, top_k=3, top_p=0.9,
                                                             max_new_tokens=3), False, None),
    "sampled-chain-top_k": (TreeConfig(3, 1, 4), SamplingParams(temperature=1.3, top_k=4, max_new_tokens=4), True,
                            None),
    # PROMPT's tokens recur often in a vocabulary of 8: the lookup branch is a second candidate nearly every step
    "chain+lookup-top_p": (TreeConfig(2, 1, 3), SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=4), False,
                           LookupConfig(3, 2)),
    "lookup-alone": (None, SamplingParams(temperature=1.2, max_new_tokens=4), False, LookupConfig(3, 2)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_first_tokens_are_distributed_as_without_speculation(tiny, case):
    tree, params, sample_draft, lookup = CASES[case]
    plain = draws(Engine(tiny, max_len=32, max_batch=BATCH), params, 0)
    spec_engine = Engine(tiny, None if tree is None else random_head(tiny.config, seed=2), tree, max_len=32,
                         max_batch=BATCH, sample_draft=sample_draft, lookup=lookup)
    spec = draws(spec_engine, params, 1)
    assert excluded(tiny, spec, params) == 0 and excluded(tiny, plain, params) == 0
    for i in range(1, params.max_new_tokens):  # token i + 1 alone, and with the token before it
        for part in (slice(i, i + 1), slice(i - 1, i + 1)):
            stat, df = chi2(Counter(s[part] for s in plain), Counter(s[part] for s in spec))
            assert stat < limit(df), (f"tokens {part.start + 1}..{part.stop}", stat, df)
    res = spec_engine.generate(PROMPT, SamplingParams(temperature=1.3, max_new_tokens=20),
                               generator=torch.Generator().manual_seed(5))
    assert len(res.tokens) == 20 and res.verify_steps < 19  # drafts do get accepted
    if lookup is not None:  # and nodes only the lookup branch proposed get accepted too
        runs = spec_engine.generate_batch([PROMPT] * 8, SamplingParams(temperature=1.3, max_new_tokens=20),
                                          generator=torch.Generator().manual_seed(5))
        assert sum(r.from_lookup for r in runs) > 8


def test_sampled_drafts_keep_greedy_rows_greedy_and_need_a_chain(tiny):
    head = random_head(tiny.config, seed=2)
    greedy = SamplingParams(max_new_tokens=12)
    plain = Engine(tiny, max_len=32).generate(PROMPT, greedy).tokens
    sampled = Engine(tiny, head, TreeConfig(3, 1, 4), max_len=32, sample_draft=True)
    top1 = Engine(tiny, head, TreeConfig(3, 1, 4), max_len=32)
    assert sampled.generate(PROMPT, greedy).tokens == plain
    assert sampled.generate(PROMPT, greedy).accepted == top1.generate(PROMPT, greedy).accepted  # top-1 drafts
    with pytest.raises(ValueError, match="needs a draft head and a chain"):
        Engine(tiny, head, TreeConfig(2, 2, 4), max_len=32, sample_draft=True)
    with pytest.raises(ValueError, match="needs a draft head and a chain"):
        Engine(tiny, None, None, max_len=32, sample_draft=True)
    with pytest.raises(ValueError, match="do not mix"):
        Engine(tiny, head, TreeConfig(3, 1, 4), max_len=32, sample_draft=True, lookup=LookupConfig(3))
