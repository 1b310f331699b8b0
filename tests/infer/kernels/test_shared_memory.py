"""The pipelined kernels (the rows GEMV, tree attention) fit their tiles to the device's shared memory per block
(kernels/shared_memory.py): the deepest pipeline that fits, then a smaller tile, unchanged where it all fits or
there is no limit (the interpreter); with a smaller tile their numbers still equal the torch reference (on CPU
under TRITON_INTERPRET=1, as the other kernel tests). tests/infer/kernels/test_aot.py compiles them for 99 KB
GPUs and checks the compiled kernels against the limit."""
import os

import pytest
import torch

if not torch.cuda.is_available():  # before the kernel module is imported: without a GPU, interpret the kernels
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from toolkit.infer.kernels import shared_memory  # noqa: E402
from toolkit.infer.kernels.gemv import gemv, reference_gemv  # noqa: E402
from toolkit.infer.kernels.tree_attention import reference_attention, tree_attention  # noqa: E402

interpreting = os.environ.get("TRITON_INTERPRET") == "1"
device = "cpu" if interpreting else "cuda"


def test_fit_keeps_what_fits_then_drops_stages_then_halves_the_tile():
    def need(stages, tile):  # a 64-wide tile: 64 KB a stage in flight, 6.4 KB besides
        return (stages - 1) * 1000 * tile + 100 * tile

    fit = shared_memory.fit
    assert fit(4, 64, need, None) == (4, 64)                  # no limit: as asked
    assert fit(4, 64, need, 3 * 64000 + 6400) == (4, 64)      # 3 buffers in flight fit
    assert fit(4, 64, need, 3 * 64000 + 6399) == (3, 64)
    assert fit(4, 64, need, 64000 + 6400) == (2, 64)
    assert fit(4, 64, need, 64000) == (2, 32)                 # 2 stages, half the tile
    assert fit(4, 64, need, 17600) == (2, 16)
    assert fit(1, 64, lambda s, t: 1000 * t, 64000) == (1, 64)  # never deeper than asked
    with pytest.raises(ValueError, match="no tile fits in this device's 17599 bytes"):
        fit(4, 64, need, 17599)


def test_the_limit_is_none_off_cuda():
    assert shared_memory.max_shared(torch.device("cpu")) is None
    assert shared_memory.operands_in_shared(torch.device("cpu")) is False
    assert shared_memory.async_copies(torch.device("cpu")) is False


@pytest.fixture
def launches(monkeypatch):
    """Set the device's shared memory per block to `limit` bytes; the launches of `kernel` (a name in `module`)
    are recorded as (grid, its constexprs and launch options)."""

    def watch(limit, module, kernel):
        seen, real = [], getattr(module, kernel)

        class Spy:
            def __getitem__(self, grid):
                def launch(*args, **kw):
                    seen.append((grid, kw))
                    return real[grid](*args, **kw)
                return launch

        monkeypatch.setattr(shared_memory, "max_shared", lambda device: limit)
        monkeypatch.setattr(shared_memory, "async_copies", lambda device: True)  # an sm_80+ part
        monkeypatch.setattr(shared_memory, "operands_in_shared", lambda device: False)  # before sm_90
        monkeypatch.setattr(module, kernel, Spy())
        return seen

    return watch


@pytest.mark.parametrize("groups", [2, 4])
def test_tree_attention_with_half_the_rows_a_program_equals_the_reference(launches, groups):
    from toolkit.infer.kernels import tree_attention as module

    g = torch.Generator().manual_seed(0)
    B, HKV, T, S, D = 2, 2, 24, 70, 64
    q = torch.randn(B, HKV * groups, T, D, generator=g).to(device)
    k, v = (torch.randn(B, HKV, S, D, generator=g).to(device) for _ in range(2))
    mask = torch.rand(B, T, S, generator=g).to(device) < 0.6
    mask[..., 0] = True
    # fp32, head_dim 64: a stage of K and V is 16 KB, a 64-row program's q and scores 24 KB; 30 KB leaves 32 rows
    # (48 or 96 of them: 64-row programs at 3 stages where it all fits)
    seen = launches(30000, module, "_attention_kernel")
    out = tree_attention(q, k, v, mask)
    (grid, kw), = seen
    assert (kw["BLOCK_R"], kw["num_stages"], grid[1]) == (32, 2, T * groups // 32 + (groups == 2)), (grid, kw)
    torch.testing.assert_close(out, reference_attention(q, k, v, mask), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["dot", "dotn", "dots"])
def test_the_rows_gemv_with_a_shorter_k_tile_equals_the_reference(launches, kind):
    from toolkit.infer.kernels import gemv as module

    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(1, 5, 300, generator=g).to(device), torch.randn(40, 300, generator=g).to(device) / 17
    norm_w = torch.randn(300, generator=g).to(device)
    residual = torch.randn(1, 5, 40, generator=g).to(device)
    # fp32, 16 rows of x and 32 of W a stage: 48 x 128 x 4 = 24 KB a stage at BLOCK_K 128, 2 KB besides
    seen = launches(20000, module, "_rows_kernel")
    y = gemv(x, w, "norm", norm_w, residual=residual, config=(kind, 32, 128, 4, 3))
    (grid, kw), = seen
    assert (kw["BLOCK_K"], kw["num_stages"]) == (64, 2), kw
    torch.testing.assert_close(y, reference_gemv(x, w, "norm", norm_w, residual=residual), atol=1e-4, rtol=1e-4)


def test_attention_halves_its_slot_block_when_even_16_rows_do_not_fit(launches):
    """fp32 at head_dim 256 on a T4 (64 KB): 16 rows at 2 stages need 100 KB with 32-slot K / V blocks, 51 KB with
    16-slot ones. Here the same at head_dim 64 and a 20 KB device, with the numbers checked."""
    from toolkit.infer.kernels import tree_attention as module

    assert shared_memory.attention_tile(64, 32, 256, 4, 4, 65536) == (2, 16, 16)
    with pytest.raises(ValueError, match="no tile fits in this device's 40000 bytes"):
        shared_memory.attention_tile(64, 32, 512, 4, 4, 40000)
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 4, 5, 64, generator=g).to(device)
    k, v = (torch.randn(1, 2, 90, 64, generator=g).to(device) for _ in range(2))
    mask = torch.rand(1, 5, 90, generator=g).to(device) < 0.5
    mask[..., 0] = True
    seen = launches(20000, module, "_attention_kernel")
    out = tree_attention(q, k, v, mask)
    (grid, kw), = seen
    assert (kw["BLOCK_R"], kw["BLOCK_S"], kw["num_stages"]) == (16, 16, 2), kw
    torch.testing.assert_close(out, reference_attention(q, k, v, mask), atol=1e-5, rtol=1e-5)
