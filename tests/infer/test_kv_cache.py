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
