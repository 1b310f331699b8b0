"""KV cache: a verify writes a tree's nodes after the prefix, then only the accepted path is kept, in order;
the rows of other sequences and the prefix are untouched."""
import torch

from toolkit.infer.config import ModelConfig
from toolkit.infer.kv_cache import KVCache

CONFIG = ModelConfig(model_type="llama", vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=2,
                     num_heads=2, num_kv_heads=1, head_dim=8, max_position_embeddings=64)


def filled_cache() -> KVCache:
    cache = KVCache(CONFIG, batch=2, max_len=16)
    # every slot holds its own number (+ 100 per row, + 1000 per layer, v negated) so moves are traceable
    slot = torch.arange(16.0)[None, None, None, :, None]
    row = 100 * torch.arange(2.0)[None, :, None, None, None]
    layer = 1000 * torch.arange(2.0)[:, None, None, None, None]
    cache.k[:] = slot + row + layer
    cache.v[:] = -(slot + row + layer)
    return cache


def test_keep_path_moves_the_accepted_nodes_after_the_prefix_in_order():
    cache, prefix = filled_cache(), 5
    before = cache.k.clone()
    cache.keep_path(1, prefix, [0, 2, 5, 6])        # root, then nodes 2, 5, 6 of the tree
    got = cache.k[:, 1, 0, prefix:prefix + 4, 0] - 100   # [layers, 4]
    want = torch.tensor([prefix + 0, prefix + 2, prefix + 5, prefix + 6], dtype=torch.float32)
    assert torch.equal(got, torch.stack([want, want + 1000]))
    assert torch.equal(cache.v[:, 1, 0, prefix:prefix + 4, 0], -cache.k[:, 1, 0, prefix:prefix + 4, 0])
    assert torch.equal(cache.k[:, 1, :, :prefix], before[:, 1, :, :prefix])   # the prefix stays
    assert torch.equal(cache.k[:, 0], before[:, 0])                         # the other sequence stays


def test_keep_path_copies_nothing_for_a_chain():
    cache = filled_cache()
    before = cache.k.clone()
    cache.keep_path(0, 3, [0, 1, 2])
    assert torch.equal(cache.k, before)


def test_a_cache_larger_than_free_memory_is_refused_with_the_figures_and_what_fits(monkeypatch):
    """--max-batch-size 100000 once allocated lazily after minutes of loading (a CPU is killed when the pages fill,
    a GPU fails in its allocator); the engine now names the sizes and the length that fits."""
    import pytest

    from toolkit.infer import kv_cache

    monkeypatch.setattr(kv_cache, "free_memory_bytes", lambda device: 10**9)
    per_slot = 2 * 1 * (8 + 8) * 4  # layers x kv heads x (k + v dims) x fp32 bytes
    assert kv_cache.cache_bytes(CONFIG, 3, 16) == per_slot * 3 * 16
    kv_cache.check_fits(CONFIG, 4, 1000, torch.float32, "cpu")  # 0.5 MB: fits
    with pytest.raises(ValueError) as err:
        kv_cache.check_fits(CONFIG, 100_000, 4096, torch.float32, "cpu", spare_rows=4)
    fits = 10**9 // (per_slot * 100_004)
    assert str(err.value) == (f"the KV cache for 100000 sequences (+ 4 prefix-cache rows) of 4096 tokens needs "
                              f"{per_slot * 100_004 * 4096 / 1e9:.1f} GB and the cpu has 1.0 GB free: lower the batch "
                              f"(--max-batch-size) or the length (--max-seq-len: {fits} fits this batch; 0 sizes it "
                              "from free memory)")
    monkeypatch.setattr(kv_cache, "free_memory_bytes", lambda device: (_ for _ in ()).throw(OSError("no meminfo")))
    kv_cache.check_fits(CONFIG, 100_000, 4096, torch.float32, "cpu")  # unknown free memory: not refused


def test_the_cli_refuses_a_batch_too_large_for_memory(tiny_target, capsys):
    from toolkit.cli import main

    code = main(["serve", str(tiny_target), "--no-speculation", "--max-num-seqs", "10000000", "--port", "0",
                 "--threads", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "toolkit serve: error: the KV cache for 10000000 sequences (+ 4 prefix-cache rows) of 1024 " \
                         "tokens needs" in err and "lower the batch (--max-batch-size)" in err, err


def test_cache_length_from_memory_is_capped_by_the_target_and_refused_under_two_slots(monkeypatch):
    """--max-seq-len 0 (max_len None): the share of free memory the rows fit in, no more than the target's
    positions; a given length is kept; a length under 2 slots is refused, naming it."""
    import pytest

    from toolkit.infer import kv_cache

    per_slot = 2 * 1 * (8 + 8) * 4  # one row's slot: layers x kv heads x (k + v dims) x fp32 bytes
    monkeypatch.setattr(kv_cache, "free_memory_bytes", lambda device: 10**9)
    assert kv_cache.cache_length(CONFIG, None, 2, 1, 0.5, torch.float32, "cpu") == 64  # memory for more
    monkeypatch.setattr(kv_cache, "free_memory_bytes", lambda device: 40 * per_slot * 3)
    assert kv_cache.cache_length(CONFIG, None, 2, 1, 0.5, torch.float32, "cpu") == 20  # half of 40 slots x 3 rows
    assert kv_cache.cache_length(CONFIG, 30, 2, 1, 0.5, torch.float32, "cpu") == 30
    monkeypatch.setattr(kv_cache, "free_memory_bytes", lambda device: per_slot * 3)
    with pytest.raises(ValueError, match="KV cache of 0 slots is too small"):
        kv_cache.cache_length(CONFIG, None, 2, 1, 0.5, torch.float32, "cpu")


def test_cuda_free_memory_counts_what_the_caching_allocator_holds_unused(monkeypatch):
    """The driver's free figure leaves out memory PyTorch reserved and freed again, which this process allocates
    first: an engine built after another in one process (bench's sweep) was refused memory it could reuse."""
    from toolkit.infer import kv_cache

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (3 * 2**30, 80 * 2**30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 20 * 2**30)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 12 * 2**30)
    assert kv_cache.free_memory_bytes("cuda:0") == (3 + 8) * 2**30
