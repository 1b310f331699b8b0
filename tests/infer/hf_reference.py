"""transformers as the reference for a target family's tests: our forward gives its logits and hidden states, and
greedy decoding (plain, and speculative with a random EAGLE-3 head: lossless) gives its `generate` tokens."""
import torch

from toolkit.infer.drafts import random_head
from toolkit.infer.engine import Engine
from toolkit.infer.sampling import SamplingParams
from toolkit.infer.tree import TreeConfig

PROMPTS = [[5, 17, 33, 8, 61, 7], [9, 4]]


def assert_forward_matches(ours, hf, length: int, layers, tol: float = 1e-4) -> None:
    """Logits and the outputs of `layers` (0-based; -1 the last) over a random batch of 2 x `length` ids.
    transformers' hidden_states are the embedding, each layer's output, and the last one after the final norm."""
    ids = torch.randint(0, ours.config.vocab_size, (2, length), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(ids, output_hidden_states=True)
        logits, aux = ours(ids, aux_layers=list(layers))
    assert (logits - want.logits).abs().max() <= tol
    for layer, h in zip(layers, aux):
        ref = want.hidden_states[layer + 1 if layer >= 0 else layer]
        assert (h - ref).abs().max() <= tol, layer


def generate_tokens(hf, new: int, prompts=PROMPTS) -> list[list[int]]:
    """transformers' greedy tokens; it stops after EOS (id 1), as the engine does with it as a stop id."""
    return [hf.generate(torch.tensor([p]), max_new_tokens=new, do_sample=False, pad_token_id=0)[0, len(p):].tolist()
            for p in prompts]


def assert_greedy_matches(target, hf, new: int, trees=(TreeConfig(3, 2, 6),), prompts=PROMPTS):
    """Plain greedy decoding, then speculation under each tree with a random EAGLE-3 head over the whole
    vocabulary, equal `generate`'s tokens (batch 2). Returns the head and those tokens."""
    want, p = generate_tokens(hf, new, prompts), SamplingParams(max_new_tokens=new)
    plain = Engine(target, max_len=64, max_batch=2).generate_batch(prompts, p, stop_ids={1})
    assert [r.tokens for r in plain] == want
    head = random_head(target.config, list(range(target.config.vocab_size)))
    for tree in trees:
        got = Engine(target, head, tree, max_len=64, max_batch=2).generate_batch(prompts, p, stop_ids={1})
        assert [r.tokens for r in got] == want, tree
    return head, want
