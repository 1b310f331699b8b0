"""When the kernels use programmatic dependent launch (toolkit/infer/kernels/pdl.py): TOOLKIT_PDL's three modes,
never on CPU, under the interpreter or before sm_90, and "auto" following the device's measured entry; and the
kernels' PDL variants, interpreted with the wait as a no-op: every program waits, and a GEMV whose first weight
tile is loaded ahead gives the same bits. That the kernels compile with it and wait before touching shared data
is tests/infer/kernels/test_aot.py's check; that their outputs stay exact on a GPU is benchmarks/gpu/lease.sh's
(the kernel tests rerun with TOOLKIT_PDL=on, and benchmarks/bench_switch.py --switch pdl)."""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():  # as the other kernel tests, before the kernel modules are imported
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from toolkit.infer.kernels import gemv, pdl  # noqa: E402

CUDA = torch.device("cuda", 0)


@pytest.fixture
def compiled(monkeypatch):
    """A process that compiles (no interpreter) on a device of compute capability 9.0 named "H-test"."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(pdl, "_capability", lambda device: (9, 0))
    monkeypatch.setattr(gemv, "_device_name", lambda device: "H-test")
    monkeypatch.setattr(gemv, "tuned_configs", lambda name: {"H-test": {"pdl": True}}.get(name, {}))


def test_modes_on_a_device_that_supports_it(compiled, monkeypatch):
    for mode, want in (("on", True), ("off", False), ("auto", True)):
        monkeypatch.setenv("TOOLKIT_PDL", mode)
        assert pdl.enabled(CUDA) is want, mode
    assert pdl.launch_kw(CUDA) == {"PDL": True, "launch_pdl": True}
    monkeypatch.delenv("TOOLKIT_PDL")
    assert pdl.enabled(CUDA)  # auto is the default


def test_auto_follows_the_devices_measured_entry(compiled, monkeypatch):
    monkeypatch.setenv("TOOLKIT_PDL", "auto")
    monkeypatch.setattr(gemv, "_device_name", lambda device: "a device nobody measured")
    assert not pdl.enabled(CUDA)
    assert pdl.launch_kw(CUDA) == {"PDL": False}


def test_never_where_it_cannot_run(compiled, monkeypatch):
    monkeypatch.setenv("TOOLKIT_PDL", "on")
    assert not pdl.enabled(torch.device("cpu"))
    assert not pdl.enabled(torch.device("meta"))
    monkeypatch.setattr(pdl, "_capability", lambda device: (8, 0))  # an A100: no griddepcontrol
    assert not pdl.enabled(CUDA)
    monkeypatch.setattr(pdl, "_capability", lambda device: (9, 0))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not pdl.enabled(CUDA)


def test_a_row_limit_keeps_pdl_to_the_launches_over_few_rows(compiled, monkeypatch):
    """TOOLKIT_PDL_MAX_ROWS, else the device entry's "pdl_max_rows": launches over more token rows go without."""
    monkeypatch.setenv("TOOLKIT_PDL", "on")
    on, off = {"PDL": True, "launch_pdl": True}, {"PDL": False}
    assert [pdl.launch_kw(CUDA, rows) for rows in (1, 8, 64)] == [on, on, on]  # no limit by default
    monkeypatch.setenv("TOOLKIT_PDL_MAX_ROWS", "1")
    assert [pdl.launch_kw(CUDA, rows) for rows in (1, 2, 8)] == [on, off, off]
    monkeypatch.delenv("TOOLKIT_PDL_MAX_ROWS")
    monkeypatch.setattr(gemv, "tuned_configs", lambda name: {"pdl": True, "pdl_max_rows": 4})
    assert [pdl.launch_kw(CUDA, rows) for rows in (1, 4, 5)] == [on, on, off]
    monkeypatch.setenv("TOOLKIT_PDL", "off")
    assert pdl.launch_kw(CUDA, 1) == off  # the limit never turns PDL on
    for bad in ("0", "-2", "two", "1.5"):
        monkeypatch.setenv("TOOLKIT_PDL_MAX_ROWS", bad)
        with pytest.raises(ValueError, match=f"pdl_max_rows='{bad}'; accepted: a whole number of rows >= 1"):
            pdl.max_rows(CUDA)


def test_a_bad_mode_is_refused_with_the_accepted_ones(compiled, monkeypatch):
    monkeypatch.setenv("TOOLKIT_PDL", "yes")
    with pytest.raises(ValueError, match="TOOLKIT_PDL='yes'; accepted: auto, on, off"):
        pdl.enabled(CUDA)


@pytest.fixture
def interpreted_pdl(monkeypatch):
    """Every launch as with PDL on, interpreted: the interpreter runs a grid's programs one after another and
    grids in order, so the wait and the early launch are exact no-ops there, and what is left to check is the
    code PDL changes: a GEMV's first weight tile loaded ahead and its loop peeled."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the PDL variants run on the GPU in benchmarks/gpu/lease.sh (TOOLKIT_PDL=on)")
    import triton.language.extra.cuda as gdc

    calls = {"wait": 0, "launch": 0}  # per program: the interpreter calls them as plain Python
    monkeypatch.setattr(gdc, "gdc_wait", lambda: calls.__setitem__("wait", calls["wait"] + 1))
    monkeypatch.setattr(gdc, "gdc_launch_dependents", lambda: calls.__setitem__("launch", calls["launch"] + 1))
    monkeypatch.setattr(pdl, "enabled", lambda device: True)
    return calls


def _rand(*shape, seed, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


GEMV_CASES = [(None, 70, 200, ("ew", 8, 64, 4, 1)), (None, 33, 256, ("ew", 1, 64, 4, 1)),
              ("norm", 70, 200, ("ew1", 8, 64, 4, 1)), ("norm", 33, 256, ("ew", 16, 128, 4, 1)),
              ("silu", 40, 96, ("ew", 8, 64, 4, 1)), ("norm2", 40, (70, 130), ("ew", 8, 64, 4, 1)),
              ("norm2", 40, (64, 64), ("ew1", 4, 64, 4, 1)), ("cat2", 40, (70, 130), ("ew", 8, 64, 4, 1)),
              ("cat2", 40, (32, 32), ("ew", 2, 64, 4, 1)), ("norm", 48, 200, ("dot", 16, 64, 4, 2)),
              (None, 40, 50, ("dot", 16, 64, 4, 2)), (None, 64, 256, ("dot", 32, 128, 4, 3)),
              ("norm", 48, 200, ("dotn", 16, 64, 4, 2)), ("norm", 64, 256, ("dotn", 32, 128, 4, 3)),
              (None, 70, 200, ("dots", 64, 64, 4, 2)), ("norm", 130, 256, ("dotsn", 64, 128, 4, 3))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("prologue, n, k, config", GEMV_CASES,
                         ids=[f"{p}-{n}x{k}-{c[0]}{c[1]}" for p, n, k, c in GEMV_CASES])
def test_a_gemv_with_its_first_tile_loaded_ahead_gives_the_same_bits(interpreted_pdl, monkeypatch, dtype, prologue,
                                                                    n, k, config):
    k1, k2 = k if isinstance(k, tuple) else (k, 0)
    x = _rand(1, 1, 2 * k1 if prologue == "silu" else k1, seed=1, dtype=dtype)
    x2 = _rand(1, 1, k2, seed=6, dtype=dtype) if k2 else None
    w = _rand(n, k1 + k2, seed=2, dtype=dtype) / (k1 + k2) ** 0.5
    nw = _rand(k1, seed=3, dtype=dtype) if prologue in ("norm", "norm2") else None
    nw2 = _rand(k2, seed=7, dtype=dtype) if prologue == "norm2" else None
    bias, residual = _rand(n, seed=4, dtype=dtype), _rand(1, 1, n, seed=5, dtype=dtype)
    if config[0].startswith("dot"):  # several rows: the matrix-unit kernel, its first tile ahead (K < BLOCK_K: one)
        x, residual = _rand(1, 3, k1, seed=1, dtype=dtype), _rand(1, 3, n, seed=5, dtype=dtype)
    call = dict(prologue=prologue, norm_w=nw, eps=1e-5, bias=bias, residual=residual, config=config, x2=x2,
                norm_w2=nw2)
    with_pdl = gemv.gemv(x, w, **call)
    programs = interpreted_pdl["wait"]
    assert programs > 0 and interpreted_pdl["launch"] == programs  # every program waited, then let the next go
    monkeypatch.setattr(pdl, "enabled", lambda device: False)
    without = gemv.gemv(x, w, **call)
    assert interpreted_pdl["wait"] == programs  # without PDL: no wait
    assert torch.equal(with_pdl, without)
    want = gemv.reference_gemv(x, w, prologue, nw, 1e-5, bias, residual, x2=x2, norm_w2=nw2)
    assert (with_pdl.float() - want.float()).norm() / want.float().norm() < (1e-4 if dtype == torch.float32 else 3e-2)


def test_every_other_kernel_takes_the_pdl_launch(interpreted_pdl):
    """The kernels that only wait: each launched with PDL on equals its reference."""
    from toolkit.infer.kernels import greedy_pick, layer_ops, sampled_pick, tree_attention

    x, w, r = _rand(3, 64, seed=1), _rand(64, seed=2), _rand(3, 64, seed=3)
    torch.testing.assert_close(layer_ops.rms_norm(x, w, 1e-5, residual=r), layer_ops.reference_rms_norm(x, w, 1e-5, r))
    x2, w2 = _rand(3, 64, seed=13), _rand(64, seed=14)
    torch.testing.assert_close(layer_ops.rms_norm_pair(x, w, x2, w2, 1e-5),
                               torch.cat([layer_ops.reference_rms_norm(x, w, 1e-5),
                                          layer_ops.reference_rms_norm(x2, w2, 1e-5)], -1))
    gu = _rand(3, 128, seed=4)
    torch.testing.assert_close(layer_ops.silu_mul(gu), layer_ops.reference_silu_mul(gu))
    pos, inv = torch.tensor([[5, 9]]), 1.0 / 10000 ** (torch.arange(0, 16, 2) / 16)
    cos, sin = layer_ops.rope_cos_sin(pos, inv, torch.float32)
    qkv, slots = _rand(1, 2, (4 + 2 * 2) * 16, seed=5), torch.tensor([[5, 9]])
    caches = [torch.zeros(1, 2, 12, 16) for _ in range(4)]
    q = layer_ops.rope_cache_write(qkv, cos, sin, slots, caches[0], caches[1], 4, 2)
    want = layer_ops.reference_rope_cache_write(qkv, cos, sin, slots, caches[2], caches[3], 4, 2)
    torch.testing.assert_close(q, want)
    torch.testing.assert_close(caches[0], caches[2])
    qa, ka, va = _rand(1, 4, 2, 16, seed=6), _rand(1, 2, 40, 16, seed=7), _rand(1, 2, 40, 16, seed=8)
    mask = torch.rand(1, 2, 40, generator=torch.Generator().manual_seed(9)) < 0.7
    lens = tree_attention.mask_lens(mask)
    assert torch.equal(lens, tree_attention.reference_mask_lens(mask))
    for splits in (1, 3):  # one kernel, and the split kernel with its merge
        torch.testing.assert_close(tree_attention.tree_attention(qa, ka, va, mask, lens=lens, splits=splits,
                                                                 block_s=16),
                                   tree_attention.reference_attention(qa, ka, va, mask), atol=1e-4, rtol=1e-4)
    logits, d2t, emb = _rand(2, 50, seed=10), torch.arange(50) * 0 + 3, _rand(60, 8, seed=11)
    for got, want in zip(greedy_pick.greedy_pick(logits, d2t, emb), greedy_pick.reference_greedy_pick(logits, d2t, emb)):
        assert torch.equal(got, want)
    g, it = _rand(2, 50, seed=12), torch.ones(2)
    for got, want in zip(sampled_pick.sampled_pick(logits, g, it, d2t, emb),
                         sampled_pick.reference_sampled_pick(logits, g, it, d2t, emb)):
        torch.testing.assert_close(got, want)
    assert interpreted_pdl["wait"] == interpreted_pdl["launch"] > 0
