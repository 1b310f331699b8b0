"""Sampling generators live on the target's device: torch.multinomial on a CUDA tensor refuses a CPU one."""
import pytest
import torch

from toolkit.infer.sampling import SamplingParams, seeded_generator


def test_seeded_generator_is_on_the_given_device_and_reproducible():
    g = seeded_generator(torch.device("cpu"), 7)
    assert isinstance(g, torch.Generator) and g.device == torch.device("cpu")
    assert torch.equal(torch.rand(4, generator=g), torch.rand(4, generator=seeded_generator("cpu", 7)))


class FakeGenerator:
    """Stands in for torch.Generator (no CUDA here): records the device it is built for."""

    def __init__(self, device="cpu"):
        self.device = torch.device(device)

    def manual_seed(self, seed):
        self.seed = seed
        return self


def test_bench_samples_with_a_generator_on_the_engines_device(monkeypatch):
    from toolkit.infer.bench import run_engine
    from toolkit.infer.sequence import Result

    class Engine:  # a CUDA target's engine, as far as run_engine can tell
        device = torch.device("cuda")
        max_len = 2048
        prefix_cache = None
        seen = []

        def warm_up(self):  # compiles nothing off a CPU
            pass

        def generate(self, ids, params, stop=frozenset(), generator=None):
            if generator is not None:  # not run_engine's warm-up
                self.seen.append(generator)
            return Result([3])

    class Tok:
        eos_token_id = 0

        def apply_chat_template(self, messages, **kw):
            return messages[-1]["content"]

        def __call__(self, text, **kw):
            return type("Enc", (), {"input_ids": [1, 2]})()

        def decode(self, ids, **kw):
            return "x"

        def get_vocab(self):  # no harmony tokens: answers decode plainly
            return {"x": 3}

    monkeypatch.setattr(torch, "Generator", FakeGenerator)
    engine = Engine()
    prompts = [{"id": 0, "category": "c", "system": None, "turns": ["hi", "again"]}]
    results, answers, _ = run_engine(engine, Tok(), prompts, SamplingParams(max_new_tokens=1), seed=3, stops={0})
    assert answers == [["x", "x"]] and len(results) == 2
    assert [g.device.type for g in engine.seen] == ["cuda", "cuda"] and engine.seen[0].seed == 3


def test_a_vanishing_temperature_is_greedy_not_nan():
    """logits / 1e-39 overflow to inf and softmax gives NaN (torch.multinomial then fails the whole batch): such
    temperatures are greedy, as in vLLM."""
    from toolkit.infer.sampling import SamplingParams, target_probs

    logits = torch.tensor([[40.0, 39.0, -3.0]])
    for t in (1e-39, 1e-30, 1e-6):
        p = SamplingParams(temperature=t)
        assert p.greedy
        assert torch.equal(target_probs(logits, p), torch.tensor([[1.0, 0.0, 0.0]]))
    assert not SamplingParams(temperature=1e-4).greedy
    assert torch.isfinite(target_probs(logits, SamplingParams(temperature=1e-4))).all()


def test_an_infinite_or_nan_temperature_is_refused():
    """temperature inf divided every logit to 0 and sampled uniformly (bench and regenerate ran with it)."""
    from toolkit.infer.sampling import SamplingParams

    for t in (float("inf"), float("nan"), -1.0):
        with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
            SamplingParams(temperature=t)


def test_bench_times_no_prompt_against_the_warm_ups_kept_kv(tiny_target, smollm2_tokenizer):
    """run_engine warms up on the first prompt's turn 1, exactly as it is then timed: with a prefix cache the
    timed request found the warm-up's KV kept and skipped its prefill (on the engine's side only, against the
    baseline and transformers). The cache is emptied after the warm-up; turn 2 still reuses turn 1's KV."""
    from toolkit.infer.bench import run_engine
    from toolkit.infer.engine import Engine
    from toolkit.infer.loading import load_target

    engine = Engine(load_target(tiny_target), max_len=256, prefix_cache_rows=2)
    prompts = [{"id": 0, "category": "c", "system": None, "turns": ["Name three colors.", "And two more?"]}]
    results, _, _ = run_engine(engine, smollm2_tokenizer, prompts, SamplingParams(max_new_tokens=4), seed=0,
                               stops=set())
    assert results[0].cached_tokens == 0 and results[1].cached_tokens > 0
