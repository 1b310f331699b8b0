"""gemv's paired epilogues (kernels/epilogues.py): SiLU-mul after the gate/up projection and RoPE + cache write after
the q/k/v projection compute what the unfused kernels compute, bit for bit with the same config, and the torch
path's numbers; a model running them (TOOLKIT_EPILOGUES=on) decodes, verifies and drafts as with them off. On CPU
under TRITON_INTERPRET=1, compiled on a GPU."""
import os

import pytest
import torch

if not torch.cuda.is_available():  # before the kernel modules are imported: without a GPU, interpret the kernels
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from toolkit.infer.kernels import epilogues  # noqa: E402
from toolkit.infer.kernels.epilogues import RopeWrite  # noqa: E402
from toolkit.infer.kernels.gemv import gemv, reference_gemv  # noqa: E402
from toolkit.infer.kernels.layer_ops import reference_rope_cache_write, reference_silu_mul, rope_cos_sin  # noqa: E402

interpreting = os.environ.get("TRITON_INTERPRET") == "1"
device = "cpu" if interpreting else "cuda"
DTYPES = [torch.float32, torch.bfloat16]
TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}
CONFIGS = [(1, 1, ("ew", 8, 64, 4, 1)), (1, 1, ("ew1", 1, 64, 4, 1)), (1, 1, ("dot", 16, 64, 4, 2)),
           (1, 5, ("dot", 32, 32, 4, 2)), (2, 8, None), (1, 3, ("torch", 0, 0, 0, 0)), (2, 4, ("dotn", 16, 64, 4, 2)),
           (1, 6, ("dotsn", 64, 64, 4, 2))]
IDS = ["ew", "ew1-one-row-a-program", "dot1", "dot5", "dot16-rule", "torch3", "dotn8-norm-folded", "dotsn6-swapped"]


def rand(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device, dtype)


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def assert_same_sums(got, want):
    """Compiled: the same bits. Interpreted, tl.dot is numpy's matmul, and where the CPU's BLAS sums a tile's
    column in an order set by its place in the tile (OpenBLAS 0.3.31 on an AVX-512 AMD EPYC: 1-8 ulp apart on the
    "dot" / "dotsn" tiles), the epilogues' paired rows (gate j beside up j) change the order: within a few fp32
    ulps then (a pairing or epilogue bug moves values by far more), and bf16 roundings of them."""
    if not interpreting:
        assert torch.equal(got, want)
    elif got.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)
    else:
        torch.testing.assert_close(got, want, rtol=2 ** -7, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("prologue", [None, "norm"])
@pytest.mark.parametrize("B, T, config", CONFIGS, ids=IDS)
def test_the_silu_epilogue_is_the_unfused_silu_mul(dtype, prologue, B, T, config):
    """gate/up rows of 2 x 37 (no block ends on them), with a norm prologue or none: the same bits as the product
    stored and layer_ops.silu_mul after it, and the torch path's silu(gate) * up."""
    k, inner = 96, 37
    x = rand(B, T, k, dtype=dtype, seed=1)
    w = rand(2 * inner, k, dtype=dtype, seed=2) / k ** 0.5
    nw = rand(k, dtype=dtype, seed=3) if prologue else None
    got = gemv(x, w, prologue, nw, 1e-5, config=config, epilogue="silu")
    assert got.shape == (B, T, inner) and got.dtype == dtype
    from toolkit.infer.kernels.layer_ops import silu_mul

    unfused = silu_mul(gemv(x, w, prologue, nw, 1e-5, config=config))
    assert_same_sums(got, unfused)
    assert rel(got, reference_silu_mul(reference_gemv(x, w, prologue, nw, 1e-5))) <= TOL[dtype]


def _rope_case(B, T, dtype, heads=4, kv_heads=2, D=16, k=96, bias=False, S=24):
    """x, the fused q/k/v weight (and bias), cos / sin at scattered positions, distinct slots per row, and two
    caches filled with the same noise."""
    x = rand(B, T, k, dtype=dtype, seed=1)
    w = rand((heads + 2 * kv_heads) * D, k, dtype=dtype, seed=2) / k ** 0.5
    b = rand(w.shape[0], dtype=dtype, seed=4) if bias else None
    positions = torch.stack([torch.randperm(200, generator=torch.Generator().manual_seed(i))[:T]
                             for i in range(B)]).to(device)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, D, 2, dtype=torch.float32, device=device) / D))
    cos, sin = rope_cos_sin(positions, inv_freq, dtype)
    slots = torch.stack([torch.randperm(S, generator=torch.Generator().manual_seed(10 + i))[:T]
                         for i in range(B)]).to(device)
    caches = [(rand(B + 1, kv_heads, S, D, dtype=dtype, seed=5), rand(B + 1, kv_heads, S, D, dtype=dtype, seed=6))
              for _ in range(3)]
    return x, w, b, cos, sin, slots, caches


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True], ids=["", "qkv-bias"])
@pytest.mark.parametrize("B, T, config", CONFIGS, ids=IDS)
def test_the_rope_epilogue_is_the_unfused_rope_cache_write(dtype, bias, B, T, config):
    """q rotated and returned, k rotated and v written at each row's slot, nothing else of the cache touched: the
    same bits as the product stored and layer_ops.rope_cache_write after it, and the torch path's numbers."""
    from toolkit.infer.kernels.layer_ops import rope_cache_write

    heads, kv_heads = 4, 2
    x, w, b, cos, sin, slots, ((k1, v1), (k2, v2), (k3, v3)) = _rope_case(B, T, dtype, heads, kv_heads, bias=bias)
    q = gemv(x, w, "norm", rand(96, dtype=dtype, seed=3), 1e-5, bias=b, config=config, epilogue="rope",
             rope=RopeWrite(cos, sin, slots, k1, v1, heads, kv_heads))
    assert q.shape == (B, heads, T, 16) and q.dtype == dtype
    qkv = gemv(x, w, "norm", rand(96, dtype=dtype, seed=3), 1e-5, bias=b, config=config)
    q2 = rope_cache_write(qkv.contiguous(), cos, sin, slots, k2, v2, heads, kv_heads)
    for fused, unfused in ((q, q2), (k1, k2), (v1, v2)):
        assert_same_sums(fused, unfused)
    q3 = reference_rope_cache_write(reference_gemv(x, w, "norm", rand(96, dtype=dtype, seed=3), 1e-5, bias=b),
                                    cos, sin, slots, k3, v3, heads, kv_heads)
    assert rel(q, q3) <= TOL[dtype] and rel(k1, k3) <= TOL[dtype] and rel(v1, v3) <= TOL[dtype]
    untouched = torch.ones_like(k1, dtype=torch.bool)
    untouched[torch.arange(B, device=device)[:, None], :, slots] = False
    fresh_k, fresh_v = _rope_case(B, T, dtype, heads, kv_heads, bias=bias)[-1][0]
    assert torch.equal(k1[untouched], fresh_k[untouched]) and torch.equal(v1[untouched], fresh_v[untouched])


def test_bad_input_is_refused():
    x, w, _, cos, sin, slots, ((k, v), _, _) = _rope_case(1, 2, torch.float32)
    rope = RopeWrite(cos, sin, slots, k, v, 4, 2)
    with pytest.raises(ValueError, match="epilogue 'gelu'"):
        gemv(x, w, epilogue="gelu")
    with pytest.raises(ValueError, match="takes no residual"):
        gemv(x, w, epilogue="silu", residual=rand(1, 2, w.shape[0]))
    with pytest.raises(ValueError, match="even number of output rows"):
        gemv(x, w[:-1], epilogue="silu")
    with pytest.raises(ValueError, match="needs rope=RopeWrite"):
        gemv(x, w, epilogue="rope")
    with pytest.raises(ValueError, match=r"\(4 \+ 2 \* 2\) \* 16 output rows"):
        gemv(x, w[:-16], epilogue="rope", rope=rope)
    with pytest.raises(ValueError, match="contiguous cos / sin"):
        gemv(x, w, epilogue="rope", rope=RopeWrite(cos[..., :1, :], sin, slots, k, v, 4, 2))
    with pytest.raises(ValueError, match="integer slots of shape"):
        gemv(x, w, epilogue="rope", rope=RopeWrite(cos, sin, slots.float(), k, v, 4, 2))
    with pytest.raises(ValueError, match="cache_v must be one layer's cache"):
        gemv(x, w, epilogue="rope", rope=RopeWrite(cos, sin, slots, k, v[:, :1], 4, 2))


def test_the_switch(monkeypatch):
    """TOOLKIT_EPILOGUES: on / off as said, auto from the device's gemv_configs.json entry (none on a CPU), and a
    bad value named with the accepted ones."""
    dev = torch.device("cpu")
    for mode, want in (("on", True), ("off", False), ("auto", False)):
        monkeypatch.setenv("TOOLKIT_EPILOGUES", mode)
        assert epilogues.enabled(dev) is want
    monkeypatch.setattr("toolkit.infer.kernels.gemv.tuned_configs", lambda name: {"epilogues": True})
    assert epilogues.enabled(dev) is True
    monkeypatch.setenv("TOOLKIT_EPILOGUES", "yes")
    with pytest.raises(ValueError, match="accepted: auto, on, off"):
        epilogues.enabled(dev)


def _steps(model, head, monkeypatch, mode):
    """On the Triton kernels with TOOLKIT_EPILOGUES=mode: the target's prompt, 3 decode steps and a verify step of 5
    tokens; the head's 3 one-token draft steps and a 3-token tree step. Their logits, hidden states and caches."""
    from toolkit.infer.kv_cache import KVCache

    monkeypatch.setenv("TOOLKIT_EPILOGUES", mode)
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 97, (1, 17), generator=g).to(device)
    cache = KVCache(model.config, 1, 32, device=device)
    dcache = head.new_cache(16, device=device)
    out = []
    with torch.no_grad():
        logits, aux = model(tokens[:, :9], cache=cache, aux_layers=[0, 1])
        out += [logits[:, -1], *aux]
        for i in range(9, 12):
            logits, aux = model(tokens[:, i:i + 1], torch.tensor([[i]], device=device), cache=cache,
                                aux_layers=[0, 1])
            out += [logits, *aux]
        pos = torch.arange(12, 17, device=device)[None]
        mask = torch.ones(1, 5, 17, dtype=torch.bool, device=device).tril(diagonal=12)
        logits, aux = model(tokens[:, 12:17], pos, cache=cache, mask=mask, aux_layers=[0, 1])
        out += [logits, *aux]
        h = torch.randn(1, 1, 3 * 64, generator=g).to(device)
        for t in range(3):
            logp, h = head(torch.randn(1, 1, 64, generator=g).to(device), h, torch.tensor([[t]], device=device),
                           dcache)
            out += [logp, h]
        logp, h = head(torch.randn(1, 3, 64, generator=g).to(device), h.expand(1, 3, 64),
                       torch.tensor([[3, 4, 4]], device=device), dcache, slots=torch.tensor([[3, 4, 5]], device=device),
                       mask=torch.tensor([[[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 1]]],
                                         dtype=torch.bool, device=device))
        out += [logp, h]
    return out + [cache.k, cache.v, dcache.k, dcache.v]


def test_a_model_decodes_verifies_and_drafts_the_same_with_the_epilogues(tiny_llama, monkeypatch):
    """A tiny Llama target (q/k/v and gate/up through the paired epilogues in every layer) and an EAGLE-3 head (its
    midlayer through them too): with TOOLKIT_EPILOGUES=on the same logits, hidden states and caches as with it off,
    and the epilogues really run."""
    import toolkit.infer.kernels.gemv as gemv_module
    from toolkit.infer.config import ModelConfig
    from toolkit.infer.drafts import random_head
    from toolkit.infer.loading import load_target
    from toolkit.infer.prepare import fuse_projections

    model = load_target(tiny_llama, device=device)
    model.set_kernels("triton")
    c = ModelConfig(model_type="llama", vocab_size=300, hidden_size=64, intermediate_size=96, num_layers=6,
                    num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=256)
    head = random_head(c, seed=3, num_layers=1).to(device)
    fuse_projections(head)
    head.set_kernels("triton")
    seen = []
    real = gemv_module.gemv
    monkeypatch.setattr(gemv_module, "gemv", lambda *a, **k: seen.append(k.get("epilogue")) or real(*a, **k))
    off = _steps(model, head, monkeypatch, "off")
    assert "rope" not in seen and "silu" not in seen
    seen.clear()
    on = _steps(model, head, monkeypatch, "on")
    # the target: 2 layers x (a 9-token prefill, 3 decode steps, a verify step: <= 16 rows each); the head: 4 steps
    assert seen.count("rope") == seen.count("silu") == 2 * 5 + 4, seen
    for a, b in zip(off, on):  # the same bits: each row's sum is the unfused kernel's, rounded the same way
        assert_same_sums(a, b)


@pytest.mark.parametrize("tree", [(3, 1, 4), (2, 2, 4)], ids=["chain", "tree"])
def test_the_engine_batches_the_same_tokens_with_the_epilogues(tiny_llama, monkeypatch, tree):
    """Three prompts of different lengths decoded together with speculation on the Triton kernels (batched decode
    and verify steps: several sequences' rows, slots and RoPE tables in one epilogue): the same tokens and
    acceptance with TOOLKIT_EPILOGUES on as off."""
    from toolkit.infer.drafts import random_head
    from toolkit.infer.engine import Engine
    from toolkit.infer.loading import load_target
    from toolkit.infer.sampling import SamplingParams
    from toolkit.infer.tree import TreeConfig

    target = load_target(tiny_llama, device=device)
    target.set_kernels("triton")
    import toolkit.infer.kernels.gemv as gemv_module

    seen, real = [], gemv_module.gemv
    monkeypatch.setattr(gemv_module, "gemv", lambda *a, **k: seen.append((k.get("epilogue"), a[0].shape[:2] if a
                                                                          else k["x"].shape[:2])) or real(*a, **k))
    prompts = [[1, 50, 35, 28, 19], [1, 88, 9], [1, 40, 17, 22, 77, 30, 5, 6, 7]]
    runs = []
    for mode in ("off", "on"):
        monkeypatch.setenv("TOOLKIT_EPILOGUES", mode)
        head = random_head(target.config, seed=1).to(device)
        # eager: a CUDA graph's replay calls no Python, and its capture happens before seen.clear()
        engine = Engine(target, head, TreeConfig(*tree), max_len=40, max_batch=4, cuda_graphs=False)
        seen.clear()
        runs.append(engine.generate_batch(prompts, SamplingParams(max_new_tokens=8)))
    # the target's batched steps (3 rows) and the head's went through the epilogues
    assert {shape[0] for ep, shape in seen if ep == "rope"} >= {3} and any(ep == "silu" for ep, _ in seen)
    assert [r.tokens for r in runs[1]] == [r.tokens for r in runs[0]]
    assert [r.accepted for r in runs[1]] == [r.accepted for r in runs[0]]
