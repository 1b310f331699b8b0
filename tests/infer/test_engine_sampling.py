"""Sampling with speculation is lossless: on a tiny random model, the joint distribution of the first
generated tokens is the same with a draft tree or chain as without speculation."""
from collections import Counter

import pytest
import torch

from toolkit.infer.drafts import random_head
from toolkit.infer.engine import Engine
from toolkit.infer.model import load_target
from toolkit.infer.sampling import SamplingParams
from toolkit.infer.tree import TreeConfig


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import transformers

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: one thread is several times faster than two here

    folder = tmp_path_factory.mktemp("tiny")
    cfg = transformers.LlamaConfig(vocab_size=8, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    torch.manual_seed(3)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    yield load_target(folder)
    torch.set_num_threads(threads)


def chi2(a: Counter, b: Counter) -> tuple[float, int]:
    """Two-sample chi-square statistic for equal sample sizes, and its degrees of freedom."""
    keys = set(a) | set(b)
    return sum((a[k] - b[k]) ** 2 / (a[k] + b[k]) for k in keys), len(keys) - 1


def joint(engine, n, params, seed):
    g = torch.Generator().manual_seed(seed)
    return Counter(tuple(engine.generate([1, 5, 2], params, generator=g).tokens) for _ in range(n))


@pytest.mark.parametrize("tree", [TreeConfig(2, 1, 3), TreeConfig(2, 3, 7)], ids=["chain", "tree"])
def test_first_tokens_are_distributed_as_without_speculation(tiny, tree):
    params = SamplingParams(temperature=1.3, top_p=0.95, max_new_tokens=2)
    n = 3000
    plain = joint(Engine(tiny, max_len=32), n, params, 0)
    spec_engine = Engine(tiny, random_head(tiny.config, seed=2), tree, max_len=32)
    spec = joint(spec_engine, n, params, 1)
    # same law => the statistic follows chi2(df); 0.999 quantiles: df 7 -> 24.3, df <= 63 -> 103.4
    stat, df = chi2(Counter(k[0] for k in plain.elements()), Counter(k[0] for k in spec.elements()))
    assert df <= 7 and stat < 24.3, stat
    stat, df = chi2(plain, spec)
    assert df <= 63 and stat < 103.4, (stat, df)
    res = spec_engine.generate([1, 5, 2], SamplingParams(temperature=1.3, max_new_tokens=20),
                               generator=torch.Generator().manual_seed(5))
    assert len(res.tokens) == 20 and res.verify_steps < 19  # drafts do get accepted
