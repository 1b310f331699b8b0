"""The fused layer kernels (RMSNorm with and without the residual add, SiLU-mul, RoPE + KV-cache write) equal
their torch references (on CPU under TRITON_INTERPRET=1, compiled on a GPU), and a model running them gives
the torch path's logits and cache."""
import os

import pytest
import torch

if not torch.cuda.is_available():  # before the kernel module is imported: without a GPU, interpret the kernels
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from toolkit.infer.kernels.layer_ops import (reference_rms_norm, reference_rope_cache_write,  # noqa: E402
                                             reference_silu_mul, rms_norm, rope_cache_write, rope_cos_sin,
                                             silu_mul)

interpreting = os.environ.get("TRITON_INTERPRET") == "1"
device = "cpu" if interpreting else "cuda"
if not interpreting and not torch.cuda.is_available():
    pytest.skip("no CUDA device and TRITON_INTERPRET is not set", allow_module_level=True)
DTYPES = [torch.float32, torch.bfloat16] if not interpreting else [torch.float32, torch.float16]
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def rand(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [64, 96])
def test_rms_norm_and_the_residual_add(dtype, n):
    x, r, w = rand(2, 5, n, dtype=dtype), rand(2, 5, n, dtype=dtype, seed=1), rand(n, dtype=dtype, seed=2)
    assert (rms_norm(x, w, 1e-5).float() - reference_rms_norm(x, w, 1e-5).float()).abs().max() <= TOL[dtype]
    h, y = rms_norm(x, w, 1e-5, residual=r)
    want_h, want_y = reference_rms_norm(x, w, 1e-5, residual=r)
    assert torch.equal(h, want_h)  # the residual stream is rounded exactly as torch's add rounds it
    assert (y.float() - want_y.float()).abs().max() <= TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul(dtype):
    gu = rand(3, 4, 2 * 1500, dtype=dtype)  # two column blocks, the second partial
    got = silu_mul(gu, block=1024)
    assert got.shape == (3, 4, 1500)
    assert (got.float() - reference_silu_mul(gu).float()).abs().max() <= TOL[dtype] * 4


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hq, hkv, d", [(4, 2, 32), (6, 3, 24)])
def test_rope_cache_write(dtype, hq, hkv, d):
    from toolkit.infer.attention import rope_cos_sin

    B, T, S = 3, 5, 20
    qkv = rand(B, T, (hq + 2 * hkv) * d, dtype=dtype)
    positions = torch.tensor([[3, 4, 4, 5, 6], [0, 1, 2, 3, 4], [9, 10, 10, 11, 11]], device=device)
    gen = torch.Generator().manual_seed(5)
    slots = torch.stack([torch.randperm(S, generator=gen)[:T] for _ in range(B)]).to(device)  # distinct per row
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2, device=device).float() / d))
    cos, sin = rope_cos_sin(positions, inv_freq, dtype)
    caches = [rand(B + 1, hkv, S, d, dtype=dtype, seed=s) for s in (3, 4)]
    want_k, want_v = caches[0].clone(), caches[1].clone()
    want_q = reference_rope_cache_write(qkv, cos, sin, slots, want_k, want_v, hq, hkv)
    got_q = rope_cache_write(qkv, cos, sin, slots, *caches, hq, hkv)
    assert got_q.shape == (B, hq, T, d)
    assert (got_q.float() - want_q.float()).abs().max() <= TOL[dtype]
    assert (caches[0].float() - want_k.float()).abs().max() <= TOL[dtype]  # rotated keys at their slots only
    assert torch.equal(caches[1], want_v)                                  # values copied as they are


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("factor", [1.0, 1.25])
def test_rope_cos_sin(dtype, factor):
    from toolkit.infer.attention import rope_cos_sin as reference

    positions = torch.tensor([[0, 1, 5, 9000], [3, 3, 4, 131000]], device=device)
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, 24, 2, device=device).float() / 24))
    for got, want in zip(rope_cos_sin(positions, inv_freq, dtype, factor), reference(positions, inv_freq, dtype, factor)):
        assert got.shape == want.shape == (2, 1, 4, 24)
        assert (got.float() - want.float()).abs().max() <= TOL[dtype]


def test_model_with_the_fused_kernels_equals_the_torch_path(tmp_path):
    """A tiny Llama prefills, decodes and verifies a tree over its KV cache with kernels="triton": the same
    logits and the same cache as the torch path."""
    import transformers

    from toolkit.infer.kv_cache import KVCache
    from toolkit.infer.loading import load_target

    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path)
    model = load_target(tmp_path, device=device)
    prompt = torch.randint(0, 97, (2, 12), device=device)
    tree = torch.randint(0, 97, (2, 4), device=device)
    depth = torch.tensor([[0, 1, 1, 2]], device=device)
    mask = torch.ones(2, 4, 16, dtype=torch.bool, device=device)
    mask[:, :, 12:] = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    outs = []
    for kernels in ("torch", "triton"):
        model.set_kernels(kernels)
        cache = KVCache(model.config, 2, 24, device=device)
        with torch.no_grad():
            first, _ = model(prompt, cache=cache)
            logits, aux = model(tree, 12 + depth.expand(2, 4), cache=cache,
                                slots=torch.arange(12, 16, device=device).expand(2, 4), mask=mask, aux_layers=[0])
        outs.append((first, logits, aux[0], cache.k.clone(), cache.v.clone()))
    for want, got in zip(*outs):
        assert (want - got).abs().max() <= 1e-4


def test_draft_head_with_the_fused_kernels_equals_the_torch_path():
    """An EAGLE-3 head with fused projections (as loading does) and kernels="triton" drafts the same log-probs
    and writes the same draft cache as the plain torch head, over a prefix and then a tree step."""
    from toolkit.infer.config import ModelConfig
    from toolkit.infer.drafts import random_head
    from toolkit.infer.prepare import fuse_projections

    c = ModelConfig(model_type="llama", vocab_size=300, hidden_size=64, intermediate_size=96, num_layers=6,
                    num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=256)
    plain = random_head(c, seed=3).to(device)
    fused = random_head(c, seed=3).to(device)
    fuse_projections(fused)
    fused.set_kernels("triton")
    g = torch.Generator().manual_seed(4)
    emb, hidden = torch.randn(2, 7, 64, generator=g).to(device), torch.randn(2, 7, 3 * 64, generator=g).to(device)
    step_emb, step_hidden = torch.randn(2, 3, 64, generator=g).to(device), torch.randn(2, 3, 64, generator=g).to(device)
    mask = torch.ones(2, 3, 10, dtype=torch.bool, device=device)
    mask[:, :, 7:] = torch.eye(3, dtype=torch.bool, device=device)
    outs = []
    for head in (plain, fused):
        cache = head.new_cache(16, device=device, batch=2)
        with torch.no_grad():
            logp, h = head(emb, hidden, torch.arange(7, device=device).expand(2, 7), cache)
            logp2, h2 = head(step_emb, step_hidden, torch.full((2, 3), 7, device=device), cache,
                             slots=torch.arange(7, 10, device=device).expand(2, 3), mask=mask)
        outs.append((logp, h, logp2, h2, cache.k.clone(), cache.v.clone()))
    for want, got in zip(*outs):
        assert (want - got).abs().max() <= 1e-4
    from toolkit.infer.draft_head import DraftHead

    with pytest.raises(ValueError, match="accepted: torch, triton"):
        DraftHead.set_kernels(plain, "cuda")


def test_rms_norm_into_half_of_a_concatenation():
    """out= writes the normed rows into a strided view (EAGLE-3's cat[norm(emb), norm(hidden)] without a cat)."""
    x, y, w1, w2 = rand(2, 3, 64), rand(2, 3, 64, seed=1), rand(64, seed=2), rand(64, seed=3)
    both = torch.full((2, 3, 128), float("nan"), device=device)
    rms_norm(x, w1, 1e-5, out=both[..., :64])
    rms_norm(y, w2, 1e-5, out=both[..., 64:])
    want = torch.cat([reference_rms_norm(x, w1, 1e-5), reference_rms_norm(y, w2, 1e-5)], -1)
    assert (both - want).abs().max() <= 1e-5
    with pytest.raises(ValueError, match="shaped like x"):
        rms_norm(x, w1, 1e-5, out=both[..., :32])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("n1, n2", [(64, 64), (48, 80)])
def test_rms_norm_pair_is_both_norms_and_their_concatenation(dtype, n1, n2):
    """One kernel for EAGLE-3's cat[norm1(emb), norm2(hidden)] (two eps), equal to the reference; with equal
    widths bit-identical to two rms_norm kernels writing the halves."""
    from toolkit.infer.kernels.layer_ops import rms_norm_pair

    x, y = rand(2, 3, n1).to(dtype), (rand(2, 3, n2, seed=1) * 3).to(dtype)
    w1, w2 = rand(n1, seed=2).to(dtype), rand(n2, seed=3).to(dtype)
    got = rms_norm_pair(x, w1, y, w2, 1e-5, 1e-6)
    want = torch.cat([reference_rms_norm(x, w1, 1e-5), reference_rms_norm(y, w2, 1e-6)], -1)
    assert got.shape == (2, 3, n1 + n2) and got.dtype == dtype
    assert (got.float() - want.float()).abs().max() <= (1e-5 if dtype == torch.float32 else 1e-2)
    if n1 == n2:
        halves = torch.empty_like(got)
        rms_norm(x, w1, 1e-5, out=halves[..., :n1])
        rms_norm(y, w2, 1e-6, out=halves[..., n1:])
        assert torch.equal(got, halves)
    with pytest.raises(ValueError, match="same leading shape"):
        rms_norm_pair(x, w1, y[:1], w2, 1e-5)


@pytest.mark.parametrize("dtype", DTYPES[1:])  # a half dtype: the two roundings part there (in fp32 they agree)
def test_rms_norm_rounded_as_gpt_oss(dtype):
    """fp32_product: the weight's product in fp32, then rounded (GptOssRMSNorm), not rounded then scaled."""
    x, r, w = rand(2, 5, 96, dtype=dtype), rand(2, 5, 96, dtype=dtype, seed=1), rand(96, dtype=dtype, seed=2)
    for residual in (None, r):
        got = rms_norm(x, w, 1e-5, residual=residual, fp32_product=True)
        want = reference_rms_norm(x, w, 1e-5, residual=residual, fp32_product=True)
        llama = reference_rms_norm(x, w, 1e-5, residual=residual)
        got, want, llama = (t if residual is None else t[1] for t in (got, want, llama))
        assert (got == want).float().mean() > 0.99 and (got.float() - want.float()).abs().max() <= TOL[dtype]
        assert (want != llama).float().mean() > 0.05  # the flag reaches the kernel: not Llama's rounding
