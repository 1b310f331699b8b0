"""The Triton tree-attention kernel equals its torch reference (on CPU under TRITON_INTERPRET=1)."""
import os

import pytest
import torch

if not torch.cuda.is_available():  # before the kernel module is imported: without a GPU, interpret the kernels
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from toolkit.infer.kernels.tree_attention import (mask_lens, reference_attention, reference_mask_lens,  # noqa: E402
                                                   tree_attention)

interpreting = os.environ.get("TRITON_INTERPRET") == "1"
device = "cpu" if interpreting else "cuda"
if not interpreting and not torch.cuda.is_available():
    pytest.skip("no CUDA device and TRITON_INTERPRET is not set", allow_module_level=True)


def tree_mask(b, prefix, parents, extra_slots=0):
    """Prefix all visible; tree nodes see their ancestors; slots after the tree are not visible."""
    n = len(parents)
    m = torch.zeros(b, n, prefix + n + extra_slots, dtype=torch.bool)
    m[:, :, :prefix] = True
    anc = torch.eye(n, dtype=torch.bool)
    for i in range(1, n):
        anc[i] |= anc[parents[i]]
    m[:, :, prefix:prefix + n] = anc
    return m


@pytest.mark.parametrize("hq, hkv, d", [(4, 4, 64), (8, 2, 64), (6, 3, 24)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("splits", [1, 3])
def test_tree_attention_matches_reference(hq, hkv, d, dtype, splits):
    g = torch.Generator().manual_seed(0)
    parents = [-1, 0, 0, 1, 1, 2, 3, 3, 4, 6, 6, 0, 11, 12, 12, 5, 15, 16, 17]  # 19 nodes: two query blocks
    b, prefix = 2, 45
    mask = tree_mask(b, prefix, parents, extra_slots=7)
    t, s = mask.shape[1], mask.shape[2]
    q = torch.randn(b, t, hq, d, generator=g).to(dtype).transpose(1, 2)   # the model's strided layout
    cache_k = torch.randn(b, hkv, s + 9, d, generator=g).to(dtype)          # a cache longer than used
    cache_v = torch.randn(b, hkv, s + 9, d, generator=g).to(dtype)
    k, v = cache_k[:, :, :s], cache_v[:, :, :s]
    q, k, v, mask = q.to(device), k.to(device), v.to(device), mask.to(device)
    got = tree_attention(q, k, v, mask, splits=splits, block_s=16).float()
    want = reference_attention(q.float(), k.float(), v.float(), mask)
    tol = 2e-5 if dtype == torch.float32 else 2e-3
    assert (got - want).abs().max() <= tol


def test_decode_and_fully_masked_rows():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(3, 4, 1, 64, generator=g).to(device)
    k = torch.randn(3, 2, 70, 64, generator=g).to(device)
    v = torch.randn(3, 2, 70, 64, generator=g).to(device)
    mask = torch.ones(3, 1, 70, dtype=torch.bool, device=device)
    mask[1, :, 33:] = False  # a shorter sequence in the batch
    mask[2] = False          # a row that may see nothing gives zeros, not NaN
    for splits in (1, 4):
        got = tree_attention(q, k, v, mask, splits=splits, block_s=16)
        assert (got - reference_attention(q, k, v, mask)).abs().max() <= 2e-5
        assert torch.equal(got[2], torch.zeros_like(got[2]))


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_scores_in_the_thousands_keep_the_softmax_finite(splits, dtype):
    """Scores of +-3,000 (keys and queries of norm ~500): exp of a score overflows; the online softmax and the
    merge of splits subtract their running max first (random-normal inputs, scores of a few units, passed a kernel
    without it). The one visible slot in a late block and a near tie are exact too."""
    g = torch.Generator().manual_seed(3)
    q = (torch.randn(2, 4, 3, 64, generator=g) * 60).to(dtype).to(device)
    k = (torch.randn(2, 2, 100, 64, generator=g) * 60).to(dtype).to(device)
    v = torch.randn(2, 2, 100, 64, generator=g).to(dtype).to(device)
    mask = torch.ones(2, 3, 100, dtype=torch.bool, device=device)
    mask[1, 0] = False
    mask[1, 0, 97] = True  # one slot, in the last block
    got = tree_attention(q, k, v, mask, splits=splits, block_s=16).float()
    want = reference_attention(q.double(), k.double(), v.double(), mask).float()
    assert got.isfinite().all() and (got - want).abs().max() <= (2e-5 if dtype == torch.float32 else 4e-3)
    assert torch.equal(got[1, :, 0], v[1, :, 97].float().repeat_interleave(2, 0))


@pytest.mark.parametrize("splits", [1, 3])
def test_slots_past_lens_are_never_read(splits):
    """A sequence's bound (lens) stops the walk over the cache: NaN planted past it changes nothing."""
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 8, 3, 32, generator=g).to(device)
    k = torch.randn(2, 2, 90, 32, generator=g)
    v = torch.randn(2, 2, 90, 32, generator=g)
    lens = torch.tensor([40, 77], dtype=torch.int32)
    mask = torch.zeros(2, 3, 90, dtype=torch.bool)
    for b, n in enumerate(lens.tolist()):
        mask[b, :, :n] = True
        k[b, :, n:], v[b, :, n:] = float("nan"), float("nan")
    k, v, mask = k.to(device), v.to(device), mask.to(device)
    got = tree_attention(q, k, v, mask.to(torch.int8), lens=lens.to(device), splits=splits, block_s=16)
    want = reference_attention(q, k.nan_to_num(0.0), v.nan_to_num(0.0), mask)
    assert not got.isnan().any() and (got - want).abs().max() <= 2e-5


def test_the_split_follows_the_sequence_not_the_cache():
    """A CUDA graph attends over the whole cache: the chunks that the programs walk are cut from each sequence's
    lens, so a 300-slot cache gives the same bits as the same call over the 77 slots in use (chunks of 300 /
    splits would leave the sequences to the first programs, and sum in other groups)."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 8, 1, 32, generator=g).to(device)
    k = torch.randn(2, 2, 300, 32, generator=g).to(device)
    v = torch.randn(2, 2, 300, 32, generator=g).to(device)
    lens = torch.tensor([40, 77], dtype=torch.int32, device=device)
    mask = torch.arange(300, device=device)[None, None, :] < lens[:, None, None]   # [2, 1, 300]
    for splits in (3, 8):
        whole = tree_attention(q, k, v, mask, lens=lens, splits=splits, block_s=16)
        used = tree_attention(q, k[:, :, :77], v[:, :, :77], mask[..., :77], lens=lens, splits=splits, block_s=16)
        assert torch.equal(whole, used)
        assert (whole - reference_attention(q, k, v, mask)).abs().max() <= 2e-5
    with pytest.raises(ValueError, match="splits must be >= 1"):
        tree_attention(q, k, v, mask, lens=lens, splits=0)


def test_model_with_the_kernel_equals_the_torch_path(tmp_path):
    """A tiny Qwen2 target verifying a draft tree over its KV cache gives the same logits either way."""
    import transformers

    from toolkit.infer.kv_cache import KVCache
    from toolkit.infer.loading import load_target

    cfg = transformers.Qwen2Config(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path)
    model = load_target(tmp_path, device=device)
    prompt = torch.randint(0, 97, (1, 20), device=device)
    parents = [-1, 0, 0, 1, 2, 2]
    tree = torch.randint(0, 97, (1, 6), device=device)
    depth = torch.tensor([[0, 1, 1, 2, 2, 2]], device=device)
    mask = tree_mask(1, 20, parents).to(device)
    outs = []
    for backend in ("torch", "triton"):
        model.set_kernels(backend)
        cache = KVCache(model.config, 1, 40, device=device)
        with torch.no_grad():
            model(prompt, cache=cache)
            logits, _ = model(tree, 20 + depth, cache=cache, slots=torch.arange(20, 26, device=device)[None],
                               mask=mask)
        outs.append(logits)
    assert (outs[0] - outs[1]).abs().max() <= 1e-4


@pytest.mark.parametrize("T, S, tile", [(1, 7, 16384), (3, 1500, 16384), (5, 2048, 16384), (5, 2048, 256),
                                        (20, 300, 256), (8, 40000, 16384)])
def test_mask_lens_equals_its_reference(T, S, tile):
    """One past the last slot each row's tokens may see; rows that see nothing give 0; tiles that do not divide
    the tokens or the slots, more tokens than a tile's 16 rows, a mask wider than a tile."""
    g = torch.Generator().manual_seed(T)
    mask = torch.rand(4, T, S, generator=g) < 0.01
    mask[1] = False                                    # sees nothing
    mask[2, -1, -1] = True                             # the very last slot
    mask[3] = False
    mask[3, 0, S // 3] = True                          # the first token alone, mid-way
    mask = mask.to(device)
    assert torch.equal(mask_lens(mask, tile), reference_mask_lens(mask))
    assert torch.equal(mask_lens(mask.to(torch.int8), tile), reference_mask_lens(mask))
