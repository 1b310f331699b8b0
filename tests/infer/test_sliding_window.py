"""Sliding-window attention (Mistral, Qwen2 with use_sliding_window, Phi-3-mini-4k, ...) in the engine: beyond the
window each sliding layer's query sees only its last `sliding_window` positions, as transformers attends. Greedy
decoding well past the window equals transformers' generate: plain, speculative (chain and tree), in a batch of
different lengths, over a prefix-cache hit and through the graph buckets."""
import pytest
import torch

from toolkit.infer.drafts import random_head
from toolkit.infer.engine import Engine
from toolkit.infer.graphs import eager_capture
from toolkit.infer.loading import load_target
from toolkit.infer.sampling import SamplingParams
from toolkit.infer.tree import TreeConfig

V, W = 97, 8
TINY = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, bos_token_id=0, eos_token_id=1)
CASES = {"mistral": ("MistralConfig", dict(sliding_window=W)),
         # layer 0 attends over everything, layers 1 and 2 slide (max_window_layers 1)
         "qwen2-mixed": ("Qwen2Config", dict(use_sliding_window=True, sliding_window=W, max_window_layers=1))}
PROMPTS = [[5, 17, 33, 8, 61, 7, 22, 40, 11, 3, 9, 70], [9, 4, 30]]


@pytest.fixture(scope="module", params=sorted(CASES))
def windowed(request, tmp_path_factory):
    """(folder, transformers model, its greedy continuations of PROMPTS: 28 tokens, past 3 windows)."""
    import transformers

    cls, extra = CASES[request.param]
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(getattr(transformers, cls)(**TINY, **extra),
                                                          dtype=torch.float32).eval()
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 1.0)  # a peaked next-token distribution
    folder = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(folder)
    want = [model.generate(torch.tensor([p]), max_new_tokens=28, do_sample=False, pad_token_id=0)[0, len(p):].tolist()
            for p in PROMPTS]
    return folder, model, want


def test_greedy_decoding_past_the_window_equals_transformers_plain_and_speculative(windowed):
    folder, _, want = windowed
    target = load_target(folder)
    assert target.config.sliding_window == W
    p = SamplingParams(max_new_tokens=28)
    assert [r.tokens for r in Engine(target, max_len=64, max_batch=2).generate_batch(PROMPTS, p, stop_ids={1})] \
        == want
    assert Engine(target, max_len=64).generate(PROMPTS[0], p, stop_ids={1}).tokens == want[0]  # batch 1, unmasked
    head = random_head(target.config, list(range(V)))
    for tree in (TreeConfig(3, 1, 4), TreeConfig(3, 3, 8)):
        got = Engine(target, head, tree, max_len=64, max_batch=2).generate_batch(PROMPTS, p, stop_ids={1})
        assert [r.tokens for r in got] == want, tree
    graphed = Engine(target, head, TreeConfig(3, 3, 8), max_len=64, max_batch=2, cuda_graphs=True,
                     graph_capture=eager_capture)
    assert [r.tokens for r in graphed.generate_batch(PROMPTS, p, stop_ids={1})] == want


def test_a_second_turn_over_a_cached_prefix_longer_than_the_window(windowed):
    folder, model, want = windowed
    target = load_target(folder)
    p = SamplingParams(max_new_tokens=10)
    later = [q + w[:20] + [3, 4] for q, w in zip(PROMPTS, want)]  # prompts of 25 and 34 tokens
    again = [model.generate(torch.tensor([q]), max_new_tokens=10, do_sample=False, pad_token_id=0)[0, len(q):]
             .tolist() for q in later]
    cached = Engine(target, random_head(target.config, list(range(V))), TreeConfig(2, 2, 4), max_len=64,
                    max_batch=2, prefix_cache_rows=2)
    cached.generate_batch([q + w[:20] for q, w in zip(PROMPTS, want)], SamplingParams(max_new_tokens=1))
    got = cached.generate_batch(later, p, stop_ids={1})
    assert [r.tokens for r in got] == again and all(r.cached_tokens > W for r in got)


def test_the_compiled_cpu_step_refuses_sequences_longer_than_the_window(windowed):
    """The check compared the cache's slots (max_len + the draft and lookup nodes) with the window: max_len equal to
    the window was refused, asking for what was given."""
    from toolkit.infer.compiled_decode import cpp_compiler
    from toolkit.infer.lookup import LookupConfig

    folder, _, _ = windowed
    target = load_target(folder)
    with pytest.raises(ValueError, match=f"slides a window of {W} over a longer one .* serve --max-seq-len {W}"):
        Engine(target, max_len=64, compile=True)
    if cpp_compiler() is None:
        return
    p = SamplingParams(max_new_tokens=4)
    want = Engine(target, max_len=W, lookup=LookupConfig(2)).generate(PROMPTS[1], p).tokens
    assert Engine(target, max_len=W, compile=True, lookup=LookupConfig(2)).generate(PROMPTS[1], p).tokens == want


def test_a_forward_without_a_cache_at_later_positions_masks_by_token_as_transformers(windowed):
    """Without a cache token t sits in slot t whatever its position: the window compared positions (100..) with
    slots (0..) and masked every key out of the sliding layers (and the causal mask let tokens see ahead)."""
    folder, model, _ = windowed
    target = load_target(folder)
    ids = torch.tensor([PROMPTS[0] * 2, PROMPTS[0][::-1] * 2])                 # [2, 24]: three windows
    positions = torch.arange(100, 124).expand(2, 24)
    with torch.no_grad():
        want = model(ids, position_ids=positions).logits
        got, _ = target(ids, positions)
    assert (got - want).abs().max() < 1e-4
