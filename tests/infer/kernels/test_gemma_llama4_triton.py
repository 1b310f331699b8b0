"""Gemma 2 / 3 and Llama 4 targets on the fused Triton kernels: the tree-attention kernel soft-caps and scales scores
as its torch reference does (Gemma 2's attn_logit_softcapping, query_pre_attn_scalar), the RMSNorm kernel scales by
(1 + w) as Gemma's norms do, and tiny random targets of each family decode the tokens transformers' `generate`
gives, plain and speculative (chain and tree), past the sliding window / across attention chunks. On CPU under
TRITON_INTERPRET=1, compiled on a GPU."""
import os
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():  # before the kernel modules are imported: without a GPU, interpret the kernels
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

device = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/infer: the families' tiny configs


@pytest.mark.parametrize("splits", [1, 3])
def test_tree_attention_soft_caps_and_scales_as_the_reference(splits):
    from toolkit.infer.kernels.tree_attention import reference_attention, tree_attention

    g = torch.Generator().manual_seed(splits)
    B, HQ, HKV, T, S, D = 2, 8, 2, 5, 70, 32
    q = (torch.randn(B, HQ, T, D, generator=g) * 3).to(device)  # scores well past the cap: tanh saturates
    k, v = (torch.randn(B, HKV, S, D, generator=g).to(device) for _ in range(2))
    mask = torch.rand(B, T, S, generator=g).to(device) < 0.7
    mask[1, 3] = False  # sees nothing: zeros
    scale, cap = 24 ** -0.5, 4.0
    got = tree_attention(q, k, v, mask, scale, splits=splits, softcap=cap)
    want = reference_attention(q, k, v, mask, scale, softcap=cap)
    assert (got - want).abs().max() < 1e-4
    assert (got - reference_attention(q, k, v, mask, scale)).abs().max() > 1e-2  # the cap changes the result
    assert got[1, :, 3].abs().max() == 0
    with pytest.raises(ValueError, match="softcap must be a positive number"):
        tree_attention(q, k, v, mask, softcap=0.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16 if device == "cpu" else torch.bfloat16])
def test_rms_norm_scales_by_one_plus_the_weight_as_gemma(dtype):
    """(bf16 rounds otherwise under the interpreter: fp16 there, as test_layer_ops.)"""
    from toolkit.infer.kernels.layer_ops import reference_rms_norm, rms_norm
    from toolkit.infer.norm import RMSNorm

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(6, 40, generator=g).to(device, dtype), (torch.randn(40, generator=g) * 0.3).to(device, dtype)
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]
    got = rms_norm(x, w, 1e-6, fp32_product=True, offset=1.0)
    assert (got - reference_rms_norm(x, w, 1e-6, fp32_product=True, offset=1.0)).abs().max() <= tol
    norm = RMSNorm(40, 1e-6, fp32_product=True, offset=1.0).to(device, dtype)
    norm.weight.data.copy_(w)
    with torch.no_grad():
        want = norm(x)  # the torch path
        norm.kernels = "triton"
        assert (norm(x) - want).abs().max() <= tol
    assert (got - rms_norm(x, w, 1e-6, fp32_product=True)).abs().max() > 0.5  # without the 1: another norm
    with pytest.raises(ValueError, match="needs fp32_product=True"):
        rms_norm(x, w, 1e-6, offset=1.0)


@pytest.mark.parametrize("case", ["gemma2", "gemma3", "scout", "maverick"])
def test_gemma_and_llama4_targets_decode_the_same_tokens_on_the_triton_kernels(case, tmp_path):
    """Prompts of 12 and 3 tokens, 12 new ones: past the 8-slot window (Gemma) and across 8-position chunks
    (Llama 4); the prefill's logits equal the torch kernels' too."""
    from hf_reference import generate_tokens
    from test_gemma import tiny_gemma
    from test_llama4 import tiny_llama4

    from toolkit.infer.drafts import random_head
    from toolkit.infer.engine import Engine
    from toolkit.infer.loading import load_target
    from toolkit.infer.sampling import SamplingParams
    from toolkit.infer.tree import TreeConfig

    hf = (tiny_gemma if case.startswith("gemma") else tiny_llama4)(case)
    hf.save_pretrained(tmp_path)
    prompts = [[5, 17, 33, 8, 61, 7, 22, 40, 11, 3, 9, 70], [9, 4, 30]]
    want = generate_tokens(hf, 12, prompts)
    torch_kernels = load_target(tmp_path, device=device)
    target = load_target(tmp_path, device=device).set_kernels("triton")
    ids = torch.tensor([prompts[0] + want[0][:8]], device=device)
    with torch.no_grad():
        assert (target(ids)[0] - torch_kernels(ids)[0]).abs().max() < 1e-4
    head = random_head(target.config, seed=1).to(device)
    for d, tree in ((None, TreeConfig()), (head, TreeConfig(3, 3, 8))):
        got = Engine(target, d, tree, max_len=48, max_batch=2, cuda_graphs=False).generate_batch(
            prompts, SamplingParams(max_new_tokens=12), stop_ids={1})
        assert [r.tokens for r in got] == want, tree
