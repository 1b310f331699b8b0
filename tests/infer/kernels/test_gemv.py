"""The one-row GEMV kernel with its prologues (RMSNorm, SiLU-mul) and epilogues (bias, residual) equals the
model's torch path (on CPU under TRITON_INTERPRET=1, compiled on a GPU), for weights in either layout and
sizes that are not multiples of the block; a model running it decodes the same tokens as torch's kernels."""
import os

import pytest
import torch

if not torch.cuda.is_available():  # before the kernel module is imported: without a GPU, interpret the kernels
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from toolkit.infer.kernels.gemv import gemv, reference_gemv  # noqa: E402

interpreting = os.environ.get("TRITON_INTERPRET") == "1"
device = "cpu" if interpreting else "cuda"
DTYPES = [torch.float32, torch.bfloat16]
TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


def rand(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("prologue", [None, "norm", "silu"])
@pytest.mark.parametrize("n, k", [(70, 200), (33, 1536)])
@pytest.mark.parametrize("extras", ["", "bias+residual"])
@pytest.mark.parametrize("rows, config", [(1, ("ew", 8, 64, 4, 1)), (1, ("ew1", 8, 64, 4, 1)),
                                          (1, ("dot", 16, 64, 4, 2)), (5, ("dot", 32, 32, 4, 2)), (16, None),
                                          (3, ("torch", 0, 0, 0, 0)), (5, ("dotn", 32, 32, 4, 2)),
                                          (16, ("dotn", 16, 128, 4, 3)), (7, ("dots", 64, 64, 4, 2)),
                                          (2, ("dotsn", 64, 128, 4, 3))],
                         ids=["ew", "ew1", "dot1", "dot5", "dot16", "torch3", "dotn5", "dotn16", "dots7", "dotsn2"])
def test_gemv_equals_the_torch_path(dtype, prologue, n, k, extras, rows, config):
    x = rand(1, rows, 2 * k if prologue == "silu" else k, dtype=dtype, seed=1)
    w = rand(n, k, dtype=dtype, seed=2) / k ** 0.5
    norm_w = rand(k, dtype=dtype, seed=3) if prologue == "norm" else None
    bias = rand(n, dtype=dtype, seed=4) if "bias" in extras else None
    residual = rand(1, rows, n, dtype=dtype, seed=5) if "residual" in extras else None
    y = gemv(x, w, prologue, norm_w, 1e-5, bias, residual, config=config)
    want = reference_gemv(x, w, prologue, norm_w, 1e-5, bias, residual)
    assert y.shape == want.shape and y.dtype == dtype
    assert not y.isnan().any()
    err = (y.float() - want.float()).norm() / want.float().norm()
    assert err <= TOL[dtype], err


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("prologue", ["norm2", "cat2"])
@pytest.mark.parametrize("k1, k2", [(64, 64), (70, 130)])
@pytest.mark.parametrize("rows, config", [(1, ("ew", 8, 64, 4, 1)), (1, ("ew1", 8, 64, 4, 1)), (1, None),
                                          (5, ("dot", 32, 32, 4, 2)), (3, ("torch", 0, 0, 0, 0))],
                         ids=["ew", "ew1", "ew-rule", "dot5", "torch3"])
def test_the_two_tensor_prologues_equal_the_torch_path(dtype, prologue, k1, k2, rows, config):
    """"norm2" (EAGLE-3's midlayer input: cat[norm1(emb), norm2(hidden)] from two tensors) and "cat2" (EAGLE-1/2's
    fc input: cat[emb, hidden] as they are) against the torch path, halves that do and do not end on a block,
    with bias and residual."""
    x, x2 = rand(1, rows, k1, dtype=dtype, seed=1) * 3, rand(1, rows, k2, dtype=dtype, seed=6)
    w = rand(40, k1 + k2, dtype=dtype, seed=2) / (k1 + k2) ** 0.5
    nw, nw2 = (rand(k1, dtype=dtype, seed=3), rand(k2, dtype=dtype, seed=7)) if prologue == "norm2" else (None, None)
    bias, residual = rand(40, dtype=dtype, seed=4), rand(1, rows, 40, dtype=dtype, seed=5)
    y = gemv(x, w, prologue, nw, 1e-5, bias, residual, config=config, x2=x2, norm_w2=nw2)
    want = reference_gemv(x, w, prologue, nw, 1e-5, bias, residual, x2=x2, norm_w2=nw2)
    assert y.shape == want.shape and y.dtype == dtype
    err = (y.float() - want.float()).norm() / want.float().norm()
    assert err <= TOL[dtype], err
    with pytest.raises(ValueError, match=f"{prologue} prologue needs x2"):
        gemv(x, w, prologue, nw, 1e-5, x2=x2[..., 1:], norm_w2=nw2)
    if prologue == "norm2":
        with pytest.raises(ValueError, match="norm_w2 of shape"):
            gemv(x, w, "norm2", nw, 1e-5, x2=x2, norm_w2=nw2[1:])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [1.0, 300.0])
def test_a_dotn_config_folds_the_norm_into_the_rows_kernel(monkeypatch, dtype, scale):
    """"dotn" / "dotsn": the RMSNorm's statistic summed from the x tiles the rows kernel loads, applied to the
    products at the end: no norm kernel runs, and the numbers are the torch path's for rows of any scale (the
    factor is 1 / RMS, so x's scale cancels); "dot" / "dots" run the norm's own kernel."""
    from toolkit.infer.kernels import layer_ops

    norms, real = [], layer_ops.rms_norm
    monkeypatch.setattr(layer_ops, "rms_norm", lambda *a, **k: norms.append(1) or real(*a, **k))
    x = rand(1, 7, 200, dtype=dtype, seed=1) * scale
    w, nw = rand(70, 200, dtype=dtype, seed=2) / 200 ** 0.5, rand(200, dtype=dtype, seed=3)
    want = reference_gemv(x, w, "norm", nw, 1e-5)
    for kind, runs in (("dotn", 0), ("dotsn", 0), ("dot", 1), ("dots", 1)):
        norms.clear()
        y = gemv(x, w, "norm", nw, 1e-5, config=(kind, 16, 64, 4, 2))
        assert len(norms) == runs, kind
        assert (y.float() - want.float()).norm() / want.float().norm() <= TOL[dtype], kind
    y = gemv(x[:, :1], w, "norm", nw, 1e-5, config=("dotn", 16, 64, 4, 2))  # one row through the rows kernel
    assert (y.float() - want[:, :1].float()).norm() / want[:, :1].float().norm() <= TOL[dtype]


def test_a_verify_step_with_the_norms_folded_equals_the_torch_path(tiny_llama, monkeypatch):
    """A target model's step of 6 tokens (a verify step) on row_step's path with every several-row GEMV a
    "dotn" config (both norms of a layer and the readout's folded into the rows kernel) gives the torch path's
    logits and KV cache, and no norm kernel runs."""
    import toolkit.infer.kernels.gemv as gemv_module
    from toolkit.infer.kernels import layer_ops
    from toolkit.infer.kv_cache import KVCache
    from toolkit.infer.loading import load_target

    model = load_target(tiny_llama, device=device)
    picked = []
    monkeypatch.setattr(gemv_module, "gemv_config",
                        lambda n, k, rows=1, device=None: picked.append(rows) or ("dotn", 16, 64, 4, 2))
    prompt, step = torch.randint(0, 97, (1, 9), device=device), torch.randint(0, 97, (1, 6), device=device)
    outs = []
    for kernels in ("torch", "triton"):
        model.set_kernels(kernels)
        cache = KVCache(model.config, 1, 24, device=device)
        with torch.no_grad():
            model(prompt, cache=cache)
            norms, real = [], layer_ops.rms_norm
            monkeypatch.setattr(layer_ops, "rms_norm", lambda *a, **k: norms.append(1) or real(*a, **k))
            logits = model(step, torch.arange(9, 15, device=device)[None], cache=cache)[0]
            monkeypatch.setattr(layer_ops, "rms_norm", real)
        outs.append((logits, cache.k.clone(), cache.v.clone()))
    assert not norms and picked.count(6) == 2 * 4 + 1, picked  # 2 layers x 4 GEMVs + the readout, 6 rows each
    for want, got in zip(*outs):
        assert (want - got).abs().max() <= 1e-4


def test_either_weight_layout_and_the_default_config():
    x, w = rand(1, 300, seed=1), rand(50, 300, seed=2)
    want = reference_gemv(x, w)
    for weight in (w, w.t().contiguous().t()):  # [out, in] rows, or the CPU's [in, out] storage
        assert torch.allclose(gemv(x, weight), want, atol=1e-4, rtol=1e-4)


def test_bad_input_is_refused():
    w = rand(8, 16)
    with pytest.raises(ValueError, match="1..16 rows of 16"):
        gemv(rand(17, 16), w)
    with pytest.raises(ValueError, match="1..16 rows of 32"):
        gemv(rand(16), w, "silu")
    with pytest.raises(ValueError, match="norm_w"):
        gemv(rand(16), w, "norm")
    with pytest.raises(ValueError, match="accepted"):
        gemv(rand(16), w, "gelu")
    with pytest.raises(ValueError, match="kind 'dotx'; accepted"):
        gemv(rand(16), w, config=("dotx", 16, 64, 4, 2))


def test_batch_one_decode_steps_run_the_gemv_layer_and_equal_the_torch_path(tiny_llama, monkeypatch):
    """One sequence decoding token by token (model.row_step: norms, SiLU-mul and residual adds folded into the
    GEMVs) gives the torch path's logits, aux hidden states and KV cache; the GEMV kernel really runs."""
    import toolkit.infer.kernels.gemv as gemv_module
    from toolkit.infer.kv_cache import KVCache
    from toolkit.infer.loading import load_target

    model = load_target(tiny_llama, device=device)
    calls = []
    real = gemv_module.gemv
    monkeypatch.setattr(gemv_module, "gemv", lambda *a, **k: calls.append(1) or real(*a, **k))
    prompt = torch.randint(0, 97, (1, 9), device=device)
    steps = torch.randint(0, 97, (1, 4), device=device)
    outs = []
    for kernels in ("torch", "triton"):
        model.set_kernels(kernels)
        cache = KVCache(model.config, 1, 24, device=device)
        with torch.no_grad():
            got = [model(prompt, cache=cache)[0][:, -1]]
            for i in range(4):
                pos = torch.tensor([[9 + i]], device=device)
                logits, aux = model(steps[:, i:i + 1], pos, cache=cache, aux_layers=[0, 1])
                got += [logits[:, -1], *aux]
        outs.append((*got, cache.k.clone(), cache.v.clone()))
    assert len(calls) == 5 * (2 * 4 + 1)  # (a 9-token prefill + 4 steps) x (2 layers x 4 GEMVs + the readout)
    for want, got in zip(*outs):
        assert (want - got).abs().max() <= 1e-4


@pytest.mark.parametrize("variant", [{}, {"norm_before_residual": True}, {"norm_before_fc": True}],
                         ids=["plain", "norm_before_residual", "norm_before_fc"])
def test_a_draft_step_of_one_row_equals_the_torch_path(monkeypatch, variant):
    """An EAGLE-3 head's one-token step (fused first layer through row_step, its two input norms in the q/k/v
    GEMV's prologue, the readout's norm in the GEMV) gives the plain head's log-probs, output hidden state and
    draft cache, at step 0 (fc over aux features) and after, and so does a 3-token (tree) step on the rows path.
    Released heads' variants too: norm_before_residual needs the normed hidden state as the residual, so its
    norms run as their own kernel (rms_norm_pair), not in the GEMV's prologue."""
    import toolkit.infer.kernels.gemv as gemv_module
    from toolkit.infer.config import ModelConfig
    from toolkit.infer.drafts import random_head
    from toolkit.infer.prepare import fuse_projections

    c = ModelConfig(model_type="llama", vocab_size=300, hidden_size=64, intermediate_size=96, num_layers=6,
                    num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=256)
    outs, prologues, real = [], [], gemv_module.gemv
    monkeypatch.setattr(gemv_module, "gemv", lambda *a, **k: prologues.append(k.get("prologue")) or real(*a, **k))
    for kernels in ("torch", "triton"):
        head = random_head(c, seed=3, num_layers=2, **variant).to(device)
        fuse_projections(head)
        head.set_kernels(kernels)
        g = torch.Generator().manual_seed(4)
        cache = head.new_cache(16, device=device)
        got = []
        prologues.clear()
        with torch.no_grad():
            h = torch.randn(1, 1, 3 * 64, generator=g).to(device)
            for t in range(3):
                logp, h = head(torch.randn(1, 1, 64, generator=g).to(device), h, torch.tensor([[t]], device=device),
                               cache)
                got += [logp, h]
            logp, h = head(torch.randn(1, 3, 64, generator=g).to(device), h.expand(1, 3, 64),
                           torch.tensor([[3, 4, 4]], device=device), cache, slots=torch.tensor([[3, 4, 5]], device=device),
                           mask=torch.tensor([[[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 1]]],
                                             dtype=torch.bool, device=device))
            got += [logp, h]
        outs.append((*got, cache.k.clone(), cache.v.clone()))
        if kernels == "triton":  # every step's q/k/v GEMV took both norms (but norm_before_residual's)
            assert prologues.count("norm2") == (0 if variant.get("norm_before_residual") else 4), prologues
    for want, got in zip(*outs):
        assert (want - got).abs().max() <= 1e-4


def three_steps(head) -> tuple:
    """A head's log-probs and output hidden states over three one-token steps from fixed random inputs, and its
    draft cache after them."""
    g = torch.Generator().manual_seed(4)
    cache, got = head.new_cache(16, device=device), []
    with torch.no_grad():
        h = torch.randn(1, 1, 64, generator=g).to(device) * 4
        for t in range(3):
            logp, h = head(torch.randn(1, 1, 64, generator=g).to(device), h, torch.tensor([[t]], device=device), cache)
            got += [logp, h]
    return (*got, cache.k.clone(), cache.v.clone())


def test_an_mtp_step_equals_the_torch_path(monkeypatch):
    """An MTP head (Llama-kind block) on row_step's path, eh_proj as a "norm2" GEMV and the block's input norm in
    the q/k/v GEMV, gives the torch path's log-probs, output hidden states and draft cache over three steps."""
    from toolkit.infer.config import ModelConfig
    from toolkit.infer.mtp import MTPHead
    from toolkit.infer.prepare import fuse_projections

    c = ModelConfig(model_type="llama", vocab_size=300, hidden_size=64, intermediate_size=96, num_layers=4,
                    num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=256)
    import toolkit.infer.kernels.gemv as gemv_module

    outs, prologues, real = [], [], gemv_module.gemv
    monkeypatch.setattr(gemv_module, "gemv", lambda *a, **k: prologues.append(a[2:3] or k.get("prologue"))
                        or widths.append((a[1:2] or [k["w"]])[0].shape[0]) or real(*a, **k))
    widths = []
    for kernels in ("torch", "triton"):
        torch.manual_seed(3)
        head = MTPHead(c, torch.randn(300, 64) * 0.1)
        with torch.no_grad():
            for norm in (head.enorm, head.hnorm, head.block.input_layernorm):
                norm.weight.uniform_(0.5, 1.5)
        head = head.to(device)
        fuse_projections(head)
        head.set_kernels(kernels)
        outs.append(three_steps(head))
    assert prologues.count(("norm2",)) == 3 and prologues.count("norm") >= 3, prologues  # eh_proj, q/k/v
    assert widths.count(300) == 3, widths  # the readout over the vocabulary: a GEMV, not cuBLAS
    for want, got in zip(*outs):
        assert (want - got).abs().max() <= 1e-4


def test_an_eagle2_step_equals_the_torch_path(monkeypatch):
    """An EAGLE-1/2 head on row_step's path, its fc over [embedding, hidden] as one "cat2" GEMV (no concatenation
    kernel) and its readout over the target's lm_head as a GEMV, gives the torch path's log-probs, output hidden
    states and draft cache over three steps."""
    import toolkit.infer.kernels.gemv as gemv_module
    from toolkit.infer.config import ModelConfig
    from toolkit.infer.draft_head import draft_config
    from toolkit.infer.eagle2 import Eagle2Head
    from toolkit.infer.prepare import fuse_projections

    c = ModelConfig(model_type="llama", vocab_size=300, hidden_size=64, intermediate_size=96, num_layers=4,
                    num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=256)
    outs, calls, real = [], [], gemv_module.gemv
    monkeypatch.setattr(gemv_module, "gemv", lambda *a, **k: calls.append((a[2:3] or (k.get("prologue"),),
                                                                           (a[1:2] or [k["w"]])[0].shape[0]))
                        or real(*a, **k))
    for kernels in ("torch", "triton"):
        torch.manual_seed(3)
        head = Eagle2Head(draft_config(c), torch.randn(300, 64) * 0.1).to(device)
        with torch.no_grad():
            head.fc.bias.uniform_(-0.5, 0.5)
        fuse_projections(head)
        head.set_kernels(kernels)
        outs.append(three_steps(head))
    assert calls.count((("cat2",), 64)) == 3 and calls.count(((None,), 300)) == 3, calls  # fc, readout
    for want, got in zip(*outs):
        assert (want - got).abs().max() <= 1e-4
