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


def test_fp16_values_of_large_magnitude_over_a_long_row_do_not_overflow():
    """Under fp16 autocast (GPUs before sm_80) the weighted sum over values is taken in fp16: 2,048 keys of values
    ~40 summed before the division by the softmax total reached inf (65,504); normalized first, it stays in range."""
    g = torch.Generator().manual_seed(0)
    L, D = 2048, 16
    q, k = (torch.randn(1, 1, L, D, generator=g) * 0.01 for _ in range(2))  # near-uniform attention
    v = 40 + torch.randn(1, 1, L, D, generator=g)
    vd, kd = 40 + torch.randn(1, 1, L, D, generator=g), torch.randn(1, 1, L, D, generator=g)
    want = ttt_attention(q, [k, kd], [v, vd], block=512)
    got = ttt_attention(q.half(), [k.half(), kd.half()], [v.half(), vd.half()], block=512)
    assert torch.isfinite(got).all()
    assert ((got.float() - want).abs() / want.abs()).max() < 2e-3


YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}  # attention factor 1.139


def _head(kind: str, num_layers: int, rope_scaling: dict | None = None, sinks: bool = False):
    from toolkit.infer.config import ModelConfig
    from toolkit.infer.drafts import random_head
    from toolkit.infer.eagle2 import Eagle2Head
    from toolkit.infer.mtp import MTPHead

    c = ModelConfig(model_type="qwen3" if kind == "mtp" else "llama", vocab_size=80, hidden_size=32,
                    intermediate_size=48, num_layers=num_layers if kind == "eagle" else 6, num_heads=4,
                    num_kv_heads=2, head_dim=8, rope_scaling=rope_scaling or {}, max_position_embeddings=256,
                    attention_sinks=sinks)
    torch.manual_seed(3)
    if kind == "eagle3":
        return random_head(c, list(range(0, 80, 2)), seed=3, num_layers=num_layers), 96
    head = Eagle2Head(c, torch.randn(80, 32) * 0.1, torch.arange(0, 80, 3)) if kind == "eagle" else \
        MTPHead(c, torch.randn(80, 32))
    with torch.no_grad():
        for name, p in head.named_parameters():
            if p.dim() > 1 and name != "lm_head.weight":
                p.normal_(0, 0.2)
            elif name.endswith("sinks"):  # GPT-OSS's: a logit per head in each softmax
                p.normal_(0, 1.0)
    return head.eval(), 32


@pytest.mark.parametrize("kind,num_layers", [("eagle3", 1), ("eagle3", 2), ("eagle", 1), ("eagle", 2), ("mtp", 1),
                                             ("eagle3-yarn", 1), ("mtp-yarn", 1), ("mtp-sinks", 1)])
def test_unrolled_steps_equal_what_the_engine_drafts(kind, num_layers):
    """Train == serve, for every head kind: TTT step i at row t gives the logits the engine's draft produces
    for the depth-i node after prefix t, with the same (teacher-forced) tokens; under yarn too, whose attention
    factor scales cos and sin (training left it out); and for an MTP block with attention sinks (GPT-OSS)."""
    from toolkit.train.ttt import unroll

    kind, _, rope = kind.partition("-")
    head, feature = _head(kind, num_layers, YARN if rope == "yarn" else None, sinks=rope == "sinks")
    assert kind != "mtp" or (rope == "sinks") == hasattr(head.block.self_attn, "sinks")
    assert rope != "yarn" or head.config.rope_attention_factor() > 1.1
    embed = torch.nn.Embedding(80, 32)
    g = torch.Generator().manual_seed(0)
    L, steps = 12, 3
    ids = torch.randint(0, 80, (1, L), generator=g)
    aux = torch.randn(1, L, feature, generator=g)
    with torch.no_grad():
        ttt, outs = unroll(head, embed, aux, ids, steps, block=5)
        for t in (0, 4, 8):  # the engine: prefill pairs 0..t, then a chain of draft nodes at t+1, t+2, ...
            cache = head.new_cache(32)
            pairs = torch.cat([ids[:, 1:], ids.new_zeros(1, 1)], 1)[:, :t + 1]
            emb = embed(pairs)
            if head.blank_position0:  # as Runner.extend feeds MTP the pair at position 0
                emb[:, 0] = 0
            logp, out = head(emb, aux[:, :t + 1], torch.arange(t + 1)[None], cache)
            assert torch.allclose(logp[0, t], ttt[0][0, t].log_softmax(-1), atol=1e-4)
            assert torch.allclose(out[0, t], outs[0][0, t], atol=1e-4)
            h = out[:, t:t + 1]
            for i in range(1, steps):
                tok = ids[:, t + i + 1:t + i + 2] if t + i + 1 < L else ids.new_zeros(1, 1)
                logp, h = head(embed(tok), h, torch.tensor([[t + i]]), cache)
                assert torch.allclose(logp[0, 0], ttt[i][0, t].log_softmax(-1), atol=1e-4), (t, i)


def _saved_bytes(fn) -> int:
    """Bytes of the distinct storages autograd keeps for the backward of fn()."""
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def test_what_is_kept_for_the_backward_grows_with_the_length_not_its_square():
    """Each block's [rows, L] scores are recomputed in the backward, not kept: doubling L doubles what autograd
    holds (an L x L fp32 score matrix per head would quadruple it; the blocks kept whole held 29 MB here at
    L = 1024, 1.75x that matrix)."""
    g = torch.Generator().manual_seed(0)
    B, H, D, steps = 1, 4, 16, 3

    def kept(L, recompute=True):
        q = torch.randn(B, H, L, D, generator=g, requires_grad=True)
        ks = [torch.randn(B, H, L, D, generator=g, requires_grad=True) for _ in range(steps)]
        vs = [torch.randn(B, H, L, D, generator=g, requires_grad=True) for _ in range(steps)]
        return _saved_bytes(lambda: ttt_attention(q, ks, vs, block=64, recompute=recompute).sum())

    small, big = kept(512), kept(1024)
    assert big < 2.5 * small
    assert big < B * H * 1024 * 1024 * 4 / 10
    assert kept(1024, recompute=False) > 8 * big  # short rows keep their scores: faster, and they fit
    assert kept(1024, recompute=None) > 8 * big
    from toolkit.train import ttt

    old, ttt.RECOMPUTE_BYTES = ttt.RECOMPUTE_BYTES, B * H * 1000 * 1000 * 4  # past it: recomputed
    try:
        assert kept(1024, recompute=None) < 2.5 * small
    finally:
        ttt.RECOMPUTE_BYTES = old


def test_recomputed_blocks_give_the_same_values_and_gradients():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 37, 16, generator=g, requires_grad=True)
    ks = [torch.randn(2, 2, 37, 16, generator=g, requires_grad=True) for _ in range(3)]
    vs = [torch.randn(2, 2, 37, 16, generator=g, requires_grad=True) for _ in range(3)]
    outs = [ttt_attention(q, ks, vs, block=8, recompute=r) for r in (False, True)]
    assert torch.equal(outs[0], outs[1])
    w = torch.randn(outs[0].shape, generator=g)
    grads = [torch.autograd.grad((o * w).sum(), [q, *ks, *vs]) for o in outs]
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-6)
