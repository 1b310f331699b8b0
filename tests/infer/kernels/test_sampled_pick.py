"""The sampled chain's pick kernel (log-softmax over the draft vocabulary, the Gumbel-max draw, d2t, the token's
embedding row) equals its torch reference (on CPU under TRITON_INTERPRET=1, compiled on a GPU), and a sampled
chain grown with it draws the torch head's tokens from the same laws and writes the same draft cache."""
import os

import pytest
import torch

if not torch.cuda.is_available():  # before the kernel module is imported: without a GPU, interpret the kernels
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from toolkit.infer.kernels.sampled_pick import reference_sampled_pick, sampled_pick  # noqa: E402

interpreting = os.environ.get("TRITON_INTERPRET") == "1"
device = "cpu" if interpreting else "cuda"
if not interpreting and not torch.cuda.is_available():
    pytest.skip("no CUDA device and TRITON_INTERPRET is not set", allow_module_level=True)
DTYPES = [torch.float32, torch.bfloat16] if not interpreting else [torch.float32, torch.float16]


def gumbel(*shape, seed=0):
    u = torch.rand(*shape, generator=torch.Generator().manual_seed(seed)).clamp_min(1e-20)
    return (-torch.log(-torch.log(u))).to(device)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n, h, block_n, block_h", [(300, 64, 128, 1024), (300, 96, 4096, 32), (8, 40, 4096, 16)])
def test_the_pick_equals_the_reference(dtype, n, h, block_n, block_h):
    g = torch.Generator().manual_seed(n + h)
    logits = (torch.randn(4, n, generator=g) * 3).to(device, dtype)
    noise = gumbel(4, n, seed=n)
    noise[1] = 0  # a greedy row in a sampled batch: no noise, its top-1
    inv_temp = torch.tensor([1.0, 1.0, 1 / 0.3, 1 / 1.7], device=device)
    ids = torch.randperm(1000, generator=g)[:n].sort().values
    d2t = (ids - torch.arange(n)).to(device)
    embed_w = torch.randn(1000, h, generator=g).to(device, dtype)
    got = sampled_pick(logits, noise, inv_temp, d2t, embed_w, block_n=block_n, block_h=block_h)
    want = reference_sampled_pick(logits, noise, inv_temp, d2t, embed_w)
    assert got[0].dtype == torch.float32 and (got[0] - want[0]).abs().max() <= 1e-5
    assert torch.equal(got[1], want[1]) and got[1].dtype == torch.long
    assert got[1][1] == ids[logits[1].argmax()].to(device)  # no noise: the top-1
    assert torch.equal(got[2], want[2])


def test_the_draws_follow_the_tempered_law():
    """2,000 rows of one distribution, each with its own noise: the kernel's draws have the law softmax(logp / T)
    at T = 0.5 (total variation under 0.05; sampling noise gives ~0.015, the law at T = 1 or 0.7 is 0.27 or 0.13
    away)."""
    n, T = 2000, 0.5
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]], device=device).expand(n, 6).contiguous()
    _, tok, _ = sampled_pick(logits, gumbel(n, 6, seed=1), torch.full((n,), 1 / T, device=device),
                             torch.zeros(6, dtype=torch.long, device=device), None)
    freq = torch.bincount(tok.cpu(), minlength=6).float() / n
    law = (torch.log_softmax(logits[0].cpu(), -1) / T).softmax(-1)
    assert 0.5 * (freq - law).abs().sum() < 0.05, (freq, law)


def test_bad_input_is_refused():
    logits, embed_w = torch.randn(2, 30, device=device), torch.randn(50, 8, device=device)
    d2t, noise, it = torch.zeros(30, dtype=torch.long, device=device), torch.zeros(2, 30, device=device), torch.ones(2)
    with pytest.raises(ValueError, match="does not cover the 30 draft ids"):
        sampled_pick(logits, noise, it, d2t[1:], embed_w)
    with pytest.raises(ValueError, match=r"must be \(2, 30\) and \(2,\)"):
        sampled_pick(logits, noise[:, 1:], it, d2t, embed_w)
    with pytest.raises(ValueError, match="contiguous"):
        sampled_pick(logits.t().contiguous().t(), noise, it, d2t, embed_w)


def test_a_sampled_chain_on_the_pick_kernel_equals_the_torch_chain(monkeypatch):
    """A sampled chain of 4 for 2 sequences (one at T = 0.8, one greedy) of different prefixes: the same target
    tokens, the same laws and the same draft cache from an EAGLE-3 head on the Triton kernels (one pick kernel
    per step) as from the plain torch head."""
    import toolkit.infer.kernels.sampled_pick as pick_module
    from toolkit.infer.config import ModelConfig
    from toolkit.infer.drafts import random_head
    from toolkit.infer.prepare import fuse_projections
    from toolkit.infer.tree import TreeConfig, draft_trees

    c = ModelConfig(model_type="llama", vocab_size=300, hidden_size=64, intermediate_size=96, num_layers=6,
                    num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=256)
    calls, real = [], pick_module.sampled_pick
    monkeypatch.setattr(pick_module, "sampled_pick", lambda *a, **k: calls.append(1) or real(*a, **k))
    g = torch.Generator().manual_seed(5)
    embed = torch.nn.Embedding(300, 64).to(device)
    prefix_emb, prefix_hidden = torch.randn(2, 6, 64, generator=g).to(device), torch.randn(2, 6, 192, generator=g)
    root_out, root_logp = torch.randn(2, 64, generator=g).to(device), torch.randn(2, 100, generator=g) * 3
    noise = gumbel(2, 4, 100, seed=6)
    noise[1] = 0
    inv_temp = torch.tensor([1 / 0.8, 1.0], device=device)
    outs = []
    for kernels in ("torch", "triton"):
        head = random_head(c, list(range(0, 300, 3)), seed=3).to(device)  # 100 draft ids: d2t is not zero
        with torch.no_grad():
            head.lm_head.weight.mul_(30)  # laws far from uniform, so that the draws say something
        fuse_projections(head)
        head.set_kernels(kernels)
        cache = head.new_cache(16, device=device, batch=2)
        with torch.no_grad():
            head(prefix_emb, prefix_hidden.to(device), torch.arange(6, device=device).expand(2, 6), cache)
            trees = draft_trees(head, embed, cache, [6, 4], [11, 12], root_out, root_logp.to(device).log_softmax(-1),
                                TreeConfig(num_steps=4, topk=1, num_draft_tokens=5), gumbel=noise, inv_temp=inv_temp)
        outs.append(([t.tokens.tolist() for t in trees], torch.stack([t.draft_logp for t in trees]), cache.k.clone(),
                     cache.v.clone()))
    assert len(calls) == 4  # the root's pick and each of the 3 steps' (the last one without an embedding row)
    assert outs[0][0] == outs[1][0] and all(t % 3 == 0 for tree in outs[0][0] for t in tree[1:])
    for want, got in zip(outs[0][1:], outs[1][1:]):
        assert (want - got).abs().max() <= 1e-4
