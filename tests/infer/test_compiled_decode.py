"""The torch.compile'd CPU decode step (compiled_decode.py) equals the eager forward: logits and aux hidden
states at every position, one graph for all positions, and the engine's greedy tokens unchanged."""
import pytest
import torch

from test_model import TINY, tiny_hf
from toolkit.infer.compiled_decode import CompiledDecode, cpp_compiler
from toolkit.infer.drafts import random_head
from toolkit.infer.engine import Engine
from toolkit.infer.kv_cache import KVCache
from toolkit.infer.loading import load_target
from toolkit.infer.sampling import SamplingParams
from toolkit.infer.tree import TreeConfig

pytestmark = pytest.mark.skipif(cpp_compiler() is None, reason="torch.compile's CPU code needs a C++ compiler")


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    """Qwen3 (q/k norm) with tied embeddings: the branches the compiled step has beyond plain Llama."""
    folder = tmp_path_factory.mktemp("qwen3")
    tiny_hf("qwen3", folder, head_dim=24, num_hidden_layers=3, tie_word_embeddings=True)
    return load_target(folder)


def test_compiled_step_equals_eager_forward(qwen3):
    torch._dynamo.reset()
    ids = torch.randint(0, TINY["vocab_size"], (1, 24), generator=torch.Generator().manual_seed(4))
    aux = [2, 0, -1]  # any order, and -1 (the final normed state)
    eager_cache, compiled_cache = KVCache(qwen3.config, 1, 64), KVCache(qwen3.config, 1, 64)
    step = CompiledDecode(qwen3, compiled_cache, aux)
    with torch.no_grad():
        qwen3(ids[:, :10], cache=eager_cache)
        qwen3(ids[:, :10], cache=compiled_cache)
        for t in range(10, 24):
            tok, pos = ids[:, t:t + 1], torch.tensor([[t]])
            want, want_aux = qwen3(tok, pos, cache=eager_cache, aux_layers=aux)
            got, got_aux = step(tok, pos, pos, None)
            assert (got - want).abs().max() <= 1e-4, t
            for a, b in zip(got_aux, want_aux):
                assert (a - b).abs().max() <= 1e-4, t
    assert (compiled_cache.k[:, :, :, :24] - eager_cache.k[:, :, :, :24]).abs().max() <= 1e-4
    # one graph serves every position (the slot is symbolic), not one compile per step
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] <= 2


def test_engine_compiled_greedy_equals_eager(qwen3):
    prompt, params = [3, 17, 5, 9], SamplingParams(max_new_tokens=20)
    eager = Engine(qwen3, max_len=64).generate(prompt, params).tokens
    compiled = Engine(qwen3, max_len=64, compile=True).generate(prompt, params).tokens
    assert compiled == eager and len(eager) == 20


def test_compiled_tree_step_equals_eager_forward(qwen3):
    """A verify step: 5 tree tokens in contiguous slots after a 12-token prefix, with a tree mask."""
    prefix, parents = 12, [-1, 0, 0, 1, 2]
    ids = torch.randint(0, TINY["vocab_size"], (1, prefix + 5), generator=torch.Generator().manual_seed(5))
    depth = [0, 1, 1, 2, 2]
    mask = torch.zeros(1, 5, prefix + 5, dtype=torch.bool)
    mask[:, :, :prefix] = True
    for t in range(5):
        node = t
        while node >= 0:
            mask[0, t, prefix + node] = True
            node = parents[node]
    tokens, positions = ids[:, prefix:], torch.tensor([[prefix + d for d in depth]])
    slots = torch.arange(prefix, prefix + 5)[None]
    eager_cache, compiled_cache = KVCache(qwen3.config, 1, 64), KVCache(qwen3.config, 1, 64)
    step = CompiledDecode(qwen3, compiled_cache, [1])
    with torch.no_grad():
        for cache in (eager_cache, compiled_cache):
            qwen3(ids[:, :prefix], cache=cache)
        want, want_aux = qwen3(tokens, positions, cache=eager_cache, slots=slots, mask=mask, aux_layers=[1])
        got, got_aux = step(tokens, positions, slots, mask)
    assert (got - want).abs().max() <= 1e-4
    assert (got_aux[0] - want_aux[0]).abs().max() <= 1e-4


def test_short_and_long_verify_steps_take_their_own_graphs_and_equal_eager(qwen3):
    """Chains of 3 then 9 tokens after a 12-token prefix: up to FEW tokens one compiled function, past it the
    other (each autotuned at its own first shape); both give the eager forward's logits."""
    from toolkit.infer.compiled_decode import FEW

    ids = torch.randint(0, TINY["vocab_size"], (1, 24), generator=torch.Generator().manual_seed(6))
    eager_cache, compiled_cache = KVCache(qwen3.config, 1, 64), KVCache(qwen3.config, 1, 64)
    step = CompiledDecode(qwen3, compiled_cache)
    calls = {"few": 0, "many": 0}
    for name in calls:
        inner = getattr(step, name)
        setattr(step, name, lambda *a, _f=inner, _n=name: calls.__setitem__(_n, calls[_n] + 1) or _f(*a))
    start = 12
    with torch.no_grad():
        for cache in (eager_cache, compiled_cache):
            qwen3(ids[:, :start], cache=cache)
        for n in (3, 9):
            positions = torch.arange(start, start + n)[None]
            mask = torch.arange(start + n)[None, None, :] <= positions[:, :, None]      # causal [1, n, S]
            want, _ = qwen3(ids[:, start:start + n], positions, cache=eager_cache, slots=positions, mask=mask)
            got, _ = step(ids[:, start:start + n], positions, positions, mask)
            assert (got - want).abs().max() <= 1e-4, n
            start += n
    assert 3 <= FEW < 9 and calls == {"few": 1, "many": 1}


@pytest.mark.parametrize("tree", [TreeConfig(4, 1, 5), TreeConfig(3, 3, 8)], ids=["chain", "tree"])
def test_engine_compiled_speculation_greedy_equals_plain(qwen3, tree):
    prompt, params = [3, 17, 5, 9], SamplingParams(max_new_tokens=20)
    plain = Engine(qwen3, max_len=64).generate(prompt, params).tokens
    head = random_head(qwen3.config, seed=0)
    got = Engine(qwen3, head, tree, max_len=64, compile=True).generate(prompt, params).tokens
    assert got == plain


def test_compiled_bf16_step_with_fp32_logits_equals_eager(tmp_path):
    """bf16 on a CPU (faster than fp32 where it is native) with --fp32-lm-head: the compiled step's logits are the
    eager forward's (fp32, Transformer.readout), so the greedy tokens are too."""
    torch._dynamo.reset()
    tiny_hf("llama", tmp_path, num_hidden_layers=3)
    target = load_target(tmp_path, torch.bfloat16).fp32_readout()
    prompt, params = [3, 17, 5, 9], SamplingParams(max_new_tokens=20)
    eager = Engine(target, max_len=64).generate(prompt, params).tokens
    cache = KVCache(target.config, 1, 64, torch.bfloat16)
    step = CompiledDecode(target, cache)
    with torch.no_grad():
        target(torch.tensor([prompt]), cache=cache)
        logits, _ = step(torch.tensor([[eager[0]]]), torch.tensor([[4]]), torch.tensor([[4]]), None)
        want = target(torch.tensor([prompt + eager[:1]]))[0][0, -1]  # the eager forward's, uncached
    # inductor keeps bf16 pointwise math in fp32 between the GEMMs, so the two differ by bf16 roundings, not more
    assert logits.dtype == torch.float32 and want.dtype == torch.float32
    assert (logits[0, 0] - want).abs().max() <= 0.02 * want.abs().max()
    assert Engine(target, max_len=64, compile=True).generate(prompt, params).tokens == eager


def test_no_cpp_compiler_is_a_clear_error(qwen3, monkeypatch):
    import toolkit.infer.compiled_decode as cd

    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(cd.shutil, "which", lambda name: None)
    with pytest.raises(ValueError, match="needs a C\\+\\+ compiler"):
        Engine(qwen3, max_len=64, compile=True)


def test_warm_up_compiles_every_step_a_chain_with_a_lookup_branch_takes(qwen3):
    """After Engine.warm_up no round compiles anything (a compile inside a timed run or a served request costs
    minutes on a real model), and the greedy tokens still equal plain decoding's."""
    from toolkit.infer.lookup import LookupConfig

    prompt, params = [3, 17, 5, 9, 3, 17, 5, 9], SamplingParams(max_new_tokens=30)
    plain = Engine(qwen3, max_len=64).generate(prompt, params).tokens
    engine = Engine(qwen3, random_head(qwen3.config, seed=0), TreeConfig(3, 1, 4), max_len=64, compile=True,
                    lookup=LookupConfig(6))
    engine.warm_up()
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    res = engine.generate(prompt, params)
    assert res.tokens == plain
    assert res.from_lookup > 0  # rounds with branch nodes past the head's 4: the many-token graph ran
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == before


def test_no_step_compiles_after_warm_up_when_a_width_equals_the_kv_heads(tmp_path):
    """A 4-KV-head target (Qwen2.5-7B, TinyLlama) with 1..4-token steps: dynamo gave the token count and the cache's
    head count one symbol, pinned it at the warm-up's width, and compiled again at the next width mid-request."""
    from toolkit.infer.lookup import LookupConfig

    tiny_hf("llama", tmp_path, num_hidden_layers=2, num_key_value_heads=4)
    target = load_target(tmp_path)
    prompt, params = [3, 17, 5, 9, 3, 17, 5, 9, 3, 17, 5, 9, 3, 17, 5], SamplingParams(max_new_tokens=40)
    plain = Engine(target, max_len=96).generate(prompt, params).tokens
    engine = Engine(target, max_len=96, compile=True, lookup=LookupConfig(3))
    engine.warm_up()
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    res = engine.generate(prompt, params)
    assert res.tokens == plain and len(set(res.checked)) > 1  # steps of several widths ran
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == before

