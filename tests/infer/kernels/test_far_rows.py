"""The kernels address a KV cache row past 2**31 elements: a cache of one layer's [batch, kv heads, max_len, D]
with batch x kv heads x max_len x D >= 2**31 (Llama-3.2-1B at batch 33 x 128k context) put its last rows at an
int32 offset b * batch-stride that wrapped: the RoPE + cache write stored them 4 GiB below the cache, attention
read there (or crashed). Each cache here is a view with the batch stride of a 2**22-slot cache over storage that
is reserved, not touched (only the few slots used are). On CPU under TRITON_INTERPRET=1, compiled on a GPU."""
import os

import pytest
import torch

if not torch.cuda.is_available():  # before the kernel modules are imported: without a GPU, interpret the kernels
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from toolkit.infer.kernels.epilogues import RopeWrite  # noqa: E402
from toolkit.infer.kernels.gemv import gemv  # noqa: E402
from toolkit.infer.kernels.layer_ops import reference_rope_cache_write, rope_cache_write, rope_cos_sin  # noqa: E402
from toolkit.infer.kernels.tree_attention import reference_attention, tree_attention  # noqa: E402

interpreting = os.environ.get("TRITON_INTERPRET") == "1"
device = "cpu" if interpreting else "cuda"
B, HQ, HKV, D, S, MAX_LEN = 9, 4, 1, 64, 16, 2 ** 22  # row 8 starts at 8 x 2**28 = 2**31 elements


def far_cache(seed: int) -> torch.Tensor:
    """[B, HKV, S, D] fp16 with batch stride HKV x MAX_LEN x D (a slice of a MAX_LEN cache), its slots noise."""
    row = HKV * MAX_LEN * D
    store = torch.empty((B - 1) * row + HKV * MAX_LEN * D, dtype=torch.float16, device=device)
    view = store.as_strided((B, HKV, S, D), (row, MAX_LEN * D, D, 1))
    g = torch.Generator().manual_seed(seed)
    for b in range(B):
        view[b].copy_(torch.randn(HKV, S, D, generator=g))
    return view


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device, torch.float16)


def rope_inputs():
    positions = torch.arange(B, device=device)[:, None] + 3                                          # [B, 1]
    inv_freq = 1.0 / (10000 ** (torch.arange(0, D, 2, dtype=torch.float32, device=device) / D))
    cos, sin = rope_cos_sin(positions, inv_freq, torch.float16)
    return cos, sin, torch.full((B, 1), 5, device=device)


def test_attention_reads_the_far_rows():
    k, v = far_cache(1), far_cache(2)
    q = rand(B, HQ, 1, D, seed=3)
    mask = torch.ones(B, 1, S, dtype=torch.bool, device=device)
    got = tree_attention(q, k, v, mask, splits=1)
    want = reference_attention(q.float(), k.float().contiguous(), v.float().contiguous(), mask)
    torch.testing.assert_close(got.float(), want, rtol=2e-3, atol=2e-3)


def test_the_rope_cache_write_stores_the_far_rows():
    (k1, v1), (k2, v2) = (far_cache(1), far_cache(2)), (far_cache(1), far_cache(2))
    qkv = rand(B, 1, (HQ + 2 * HKV) * D, seed=3)
    cos, sin, slots = rope_inputs()
    rope_cache_write(qkv, cos, sin, slots, k1, v1, HQ, HKV)
    reference_rope_cache_write(qkv, cos, sin, slots, k2, v2, HQ, HKV)
    torch.testing.assert_close(k1.float(), k2.float(), rtol=2e-3, atol=4e-3)
    assert torch.equal(v1, v2)


def test_the_gemv_rope_epilogue_stores_the_far_rows():
    (k1, v1), (k2, v2) = (far_cache(1), far_cache(2)), (far_cache(1), far_cache(2))
    x, w = rand(B, 1, 96, seed=3), rand((HQ + 2 * HKV) * D, 96, seed=4) / 96 ** 0.5
    cos, sin, slots = rope_inputs()
    gemv(x, w, config=("dot", 16, 64, 4, 2), epilogue="rope", rope=RopeWrite(cos, sin, slots, k1, v1, HQ, HKV))
    reference_rope_cache_write(gemv(x, w, config=("dot", 16, 64, 4, 2)), cos, sin, slots, k2, v2, HQ, HKV)
    torch.testing.assert_close(k1.float(), k2.float(), rtol=2e-3, atol=4e-3)
    torch.testing.assert_close(v1.float(), v2.float(), rtol=2e-3, atol=4e-3)
