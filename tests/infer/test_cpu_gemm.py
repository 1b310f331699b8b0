"""The packed readout on a CPU (cpu_gemm.py): several rows are read out from oneDNN's packed copy, one row from the
weight itself, with the same numbers (to fp32 rounding); a weight written in place, replaced, reshaped or moved since
the copy was made gets a new copy, a weight or input wanting a gradient reads the weight; a packed module loads under
inference_mode, deep-copies, saves and compiles whole; targets and draft heads get the copy where they load, and a
target's verify-step logits equal its plain ones."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from toolkit.infer.cpu_gemm import PackedReadout, pack, source

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="oneDNN is not built in")


def frozen_linear(out=300, inp=48, seed=0, bias=False):
    """A frozen nn.Linear (readouts have no bias; with one, the copy's product adds it as F.linear does)."""
    torch.manual_seed(seed)
    m = nn.Linear(inp, out, bias=bias)
    m.requires_grad_(False)
    return m


@pytest.mark.parametrize("shape", [(1, 48), (1, 1, 48), (2, 48), (3, 5, 48), (16, 48)])
def test_rows_equal_the_weights_own_linear(shape):
    m = frozen_linear()
    pack(m)
    x = torch.randn(shape)
    got = m(x)
    assert got.shape == (*shape[:-1], 300)
    assert (got - F.linear(x, m.weight)).abs().max() <= 1e-5
    if x.numel() > 48:  # from the copy: not a view, as F.linear's bias-free output (graphs.py copies into it)
        assert not got._is_view()


def test_several_rows_come_from_the_packed_copy_one_row_from_the_weight():
    """A copy packed from 2 W stands in for W's: two rows and more read it, one row does not."""
    m = frozen_linear(bias=True)
    pack(m)
    twice = frozen_linear(bias=True)
    twice.weight.mul_(2)
    pack(twice)
    m.packed = (m.packed[0], twice.packed[1])
    one, two = torch.randn(1, 48), torch.randn(2, 48)
    assert isinstance(m, PackedReadout) and set(m.state_dict()) == {"weight", "bias"}
    assert torch.allclose(m(one), F.linear(one, m.weight, m.bias), atol=1e-5)
    assert torch.allclose(m(two), 2 * F.linear(two, m.weight) + m.bias, atol=1e-4)


def fresh(m, x):
    """m(x) equals the weight's own product, and the copy is of the weight held now."""
    assert torch.allclose(m(x), F.linear(x, m.weight, m.bias), atol=1e-4)
    return m.packed is not None and m.packed[0] == source(m.weight)


def test_a_weight_changed_since_the_copy_gets_a_new_one():
    x = torch.randn(4, 48)
    m = frozen_linear()
    pack(m)
    with torch.no_grad():
        m.weight.mul_(3)  # written in place: the copy is of the old values
    assert fresh(m, x)
    m.weight = nn.Parameter(torch.randn(300, 48), requires_grad=False)  # replaced
    assert fresh(m, x)
    m.weight = nn.Parameter(m.weight[:200], requires_grad=False)  # the same storage, fewer rows
    assert fresh(m, x)
    m.half().float()  # moved: a round trip through fp16 (the same address may come back)
    assert m.packed is None and fresh(m, x)
    m.double()  # not fp32: no copy, the weight's own product
    assert torch.equal(m(x.double()), F.linear(x.double(), m.weight, m.bias)) and m.packed is None


def test_a_gradient_still_flows_to_the_weight_and_to_the_input():
    m = frozen_linear()
    pack(m)
    x = torch.randn(4, 48, requires_grad=True)
    m(x).sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    m.weight.requires_grad_(True)
    m(torch.randn(4, 48)).sum().backward()
    assert m.weight.grad is not None and m.weight.grad.abs().sum() > 0


def test_only_cpu_fp32_weights_are_packed():
    m = frozen_linear().to(torch.bfloat16)
    pack(m)
    assert m.packed is None
    x = torch.randn(4, 48, dtype=torch.bfloat16)
    assert torch.equal(m(x), F.linear(x, m.weight, m.bias)) and m.packed is None


def test_a_packed_module_loads_under_inference_mode_deep_copies_saves_and_compiles_whole(tmp_path):
    import copy

    with torch.inference_mode():
        m = frozen_linear()
        pack(m)  # an inference tensor keeps no version counter
        assert fresh(m, torch.randn(4, 48))
    m = frozen_linear()
    pack(m)
    clone = copy.deepcopy(m)
    assert clone.packed is None and fresh(clone, torch.randn(4, 48))
    torch.save(m, tmp_path / "m.pt")
    assert torch.equal(torch.load(tmp_path / "m.pt", weights_only=False).weight, m.weight)
    explained = torch._dynamo.explain(lambda x: m(x) * 2)(torch.randn(4, 48))
    assert explained.graph_count == 1 and explained.graph_break_count == 0  # torch.compile: inductor packs its own


def test_targets_and_draft_heads_load_with_a_packed_readout_and_verify_as_they_decode(tiny_target, tiny_draft):
    """A tiny Llama target with SmolLM2's 49,152-token vocabulary: its lm_head carries the copy (readout_layout), so
    does an EAGLE-3 head loaded from its folder; logits of 6 tokens in one step (the packed readout) equal those of
    6 one-token steps (the weight's own GEMV)."""
    from toolkit.infer.draft_folder import load_draft
    from toolkit.infer.kv_cache import KVCache
    from toolkit.infer.loading import load_target

    target = load_target(tiny_target)
    head = load_draft(str(tiny_draft), target, None)
    for lm_head in (target.lm_head, head.lm_head):
        assert isinstance(lm_head, PackedReadout) and lm_head.packed[0] == source(lm_head.weight)
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
