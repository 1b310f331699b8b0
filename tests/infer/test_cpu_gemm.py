"""The packed readout on a CPU (cpu_gemm.py): several rows are read out from oneDNN's packed copy, one row from the
weight itself, with the same numbers (to fp32 rounding); a weight written in place, replaced, cast or wanting a
gradient since the copy was made is read out from itself; targets and every kind of draft head get the copy where
they load, and a target's verify-step logits equal its plain ones."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from toolkit.infer.cpu_gemm import linear_rows, pack

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="oneDNN is not built in")


def frozen_linear(out=300, inp=48, seed=0):
    torch.manual_seed(seed)
    m = nn.Linear(inp, out, bias=False)
    m.weight.requires_grad_(False)
    return m


@pytest.mark.parametrize("shape", [(1, 48), (1, 1, 48), (2, 48), (3, 5, 48), (16, 48)])
def test_rows_equal_the_weights_own_linear(shape):
    m = frozen_linear()
    pack(m)
    x = torch.randn(shape)
    got = linear_rows(m, x)
    assert got.shape == (*shape[:-1], 300) and not got._is_view()  # as F.linear's: written into by graphs.py
    assert (got - F.linear(x, m.weight)).abs().max() <= 1e-5


def test_several_rows_come_from_the_packed_copy_one_row_from_the_weight():
    """A copy packed from 2 W stands in for W's: two rows and more read it, one row does not."""
    m = frozen_linear()
    pack(m)
    twice = frozen_linear()
    twice.weight.mul_(2)
    pack(twice)
    m.packed.weight = twice.packed.weight
    one, two = torch.randn(1, 48), torch.randn(2, 48)
    assert torch.allclose(linear_rows(m, one), F.linear(one, m.weight), atol=1e-5)
    assert torch.allclose(linear_rows(m, two), 2 * F.linear(two, m.weight), atol=1e-4)


def test_a_weight_changed_since_the_copy_is_read_from_itself():
    x = torch.randn(4, 48)
    m = frozen_linear()
    pack(m)
    with torch.no_grad():
        m.weight.mul_(3)  # written in place: the copy is of the old values
    assert torch.allclose(linear_rows(m, x), F.linear(x, m.weight), atol=1e-4)
    m = frozen_linear()
    pack(m)
    m.weight = nn.Parameter(torch.randn(300, 48), requires_grad=False)  # replaced
    assert torch.allclose(linear_rows(m, x), F.linear(x, m.weight), atol=1e-4)
    m = frozen_linear()
    pack(m)
    m.double()  # cast: the copy is fp32
    assert torch.equal(linear_rows(m, x.double()), F.linear(x.double(), m.weight))


def test_a_weight_that_wants_a_gradient_gets_one():
    m = frozen_linear()
    pack(m)
    m.weight.requires_grad_(True)
    linear_rows(m, torch.randn(4, 48)).sum().backward()
    assert m.weight.grad is not None and m.weight.grad.abs().sum() > 0


def test_only_cpu_fp32_weights_are_packed():
    m = frozen_linear().to(torch.bfloat16)
    pack(m)
    assert m.packed is None
    x = torch.randn(4, 48, dtype=torch.bfloat16)
    assert torch.equal(linear_rows(m, x), F.linear(x, m.weight))


def test_targets_and_draft_heads_load_with_a_packed_readout_and_verify_as_they_decode(tiny_target, tiny_draft):
    """A tiny Llama target with SmolLM2's 49,152-token vocabulary: its lm_head carries the copy (readout_layout), so
    does an EAGLE-3 head loaded from its folder; logits of 6 tokens in one step (the packed readout) equal those of
    6 one-token steps (the weight's own GEMV)."""
    from toolkit.infer.draft_folder import load_draft
    from toolkit.infer.kv_cache import KVCache
    from toolkit.infer.loading import load_target

    target = load_target(tiny_target)
    head = load_draft(str(tiny_draft), target, None)
    assert target.lm_head.packed.of(target.lm_head.weight) and head.lm_head.packed.of(head.lm_head.weight)
    prompt, tokens = torch.tensor([[5, 17, 33, 8, 61]]), torch.tensor([[40, 11, 3, 9, 70, 2]])
    steps, whole = KVCache(target.config, 1, 32), KVCache(target.config, 1, 32)
    with torch.no_grad():
        for cache in (steps, whole):
            target(prompt, torch.arange(5)[None], cache, torch.arange(5)[None])
        one = torch.cat([target(tokens[:, i:i + 1], torch.tensor([[5 + i]]), steps, torch.tensor([[5 + i]]))[0]
                         for i in range(6)], dim=1)
        pos = torch.arange(5, 11)[None]
        six = target(tokens, pos, whole, pos.clone(), torch.arange(11)[None, None, :] <= pos[:, :, None])[0]
    assert (six - one).abs().max() <= 1e-4
    assert torch.equal(six.argmax(-1), one.argmax(-1))
