"""The blockwise TTT attention equals a naive reference that runs each step's full attention explicitly,
values and gradients."""
import pytest
import torch

from toolkit.train.ttt import ttt_attention


def naive_ttt_attention(q, ks, vs, valid=None):
    """Each unrolled step's whole attention over all (step, position) keys, under an explicit mask."""
    B, H, L, D = q.shape
    groups = H // ks[0].shape[1]
    k = torch.cat(ks, 2).repeat_interleave(groups, 1)                 # [B, H, (i+1)L, D]
    v = torch.cat(vs, 2).repeat_interleave(groups, 1)
    t = torch.arange(L)
    mask = torch.cat([t[None, :] <= t[:, None]] + [t[None, :] == t[:, None]] * (len(ks) - 1), 1)
    mask = mask[None].expand(B, -1, -1)                                # [B, L, (i+1)L]
    if valid is not None:
        mask = mask & torch.cat([valid] + [torch.ones_like(valid)] * (len(ks) - 1), 1)[:, None, :]
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])


@pytest.mark.parametrize("steps", [1, 2, 4, 7])
@pytest.mark.parametrize("block", [1, 5, 64])
def test_blockwise_ttt_attention_equals_the_naive_unrolled_reference(steps, block):
    g = torch.Generator().manual_seed(steps * 10 + block)
    B, H, Hkv, L, D = 2, 4, 2, 19, 16
    q = torch.randn(B, H, L, D, generator=g, requires_grad=True)
    ks = [torch.randn(B, Hkv, L, D, generator=g, requires_grad=True) for _ in range(steps)]
    vs = [torch.randn(B, Hkv, L, D, generator=g, requires_grad=True) for _ in range(steps)]
    valid = torch.ones(B, L, dtype=torch.bool)
    valid[1, 15:] = False  # the second sequence is padded
    got = ttt_attention(q, ks, vs, block=block, valid=valid)
    want = naive_ttt_attention(q, ks, vs, valid)
    assert (got[0] - want[0]).abs().max() < 1e-5
    assert (got[1, :, :15] - want[1, :, :15]).abs().max() < 1e-5  # padded query rows are never trained on
    w = torch.randn(got.shape, generator=g)
    grads = torch.autograd.grad((got[:, :, :15] * w[:, :, :15]).sum(), [q, *ks, *vs])
    refs = torch.autograd.grad((want[:, :, :15] * w[:, :, :15]).sum(), [q, *ks, *vs])
    for a, b in zip(grads, refs):
        assert (a - b).abs().max() < 1e-4


def test_step_zero_is_plain_causal_attention():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 9, 8, generator=g) for _ in range(3))
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert (ttt_attention(q, [k], [v], block=4) - want).abs().max() < 1e-5
