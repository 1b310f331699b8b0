"""The greedy chain's pick kernel (argmax over the draft vocabulary, d2t, the token's embedding row) equals its
torch reference (on CPU under TRITON_INTERPRET=1, compiled on a GPU), and a greedy chain grown with it drafts
the torch head's tokens and writes its draft cache."""
import os

import pytest
import torch

if not torch.cuda.is_available():  # before the kernel module is imported: without a GPU, interpret the kernels
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from toolkit.infer.kernels.greedy_pick import greedy_pick, reference_greedy_pick  # noqa: E402

interpreting = os.environ.get("TRITON_INTERPRET") == "1"
device = "cpu" if interpreting else "cuda"
if not interpreting and not torch.cuda.is_available():
    pytest.skip("no CUDA device and TRITON_INTERPRET is not set", allow_module_level=True)
DTYPES = [torch.float32, torch.bfloat16] if not interpreting else [torch.float32, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n, h, block_n, block_h", [(300, 64, 128, 1024), (300, 96, 4096, 32), (8, 40, 4096, 16)])
def test_the_pick_equals_the_reference(dtype, n, h, block_n, block_h):
    g = torch.Generator().manual_seed(n + h)
    logits = torch.randn(3, n, generator=g).to(device, dtype)
    ids = torch.randperm(1000, generator=g)[:n].sort().values
    d2t = (ids - torch.arange(n)).to(device)
    embed_w = torch.randn(1000, h, generator=g).to(device, dtype)
    got_tok, got_emb = greedy_pick(logits, d2t, embed_w, block_n=block_n, block_h=block_h)
    want_tok, want_emb = reference_greedy_pick(logits, d2t, embed_w)
    assert torch.equal(got_tok, want_tok) and got_tok.dtype == torch.long
    assert torch.equal(got_emb, want_emb)


def test_equal_maxima_give_the_first_as_torch_argmax_does():
    """Within a block and across blocks (the running max is replaced only by a strictly larger one)."""
    logits = torch.zeros(3, 300, device=device)
    logits[0, [7, 9]] = 5.0             # one block
    logits[1, [100, 130, 299]] = 5.0    # blocks of 128: 100 in the first, 130 and 299 later
    logits[2] = -1.0                    # all equal: id 0
    d2t, embed_w = torch.zeros(300, dtype=torch.long, device=device), torch.randn(300, 8, device=device)
    tok, emb = greedy_pick(logits, d2t, embed_w, block_n=128)
    assert tok.tolist() == [7, 100, 0] == logits.argmax(-1).tolist()
    assert torch.equal(emb, embed_w[[7, 100, 0]])
    alone, none = greedy_pick(logits, d2t + 1, None, block_n=128)  # a chain's last step: the ids alone
    assert alone.tolist() == [8, 101, 1] and none is None


def test_bad_input_is_refused():
    logits, embed_w = torch.randn(2, 30, device=device), torch.randn(50, 8, device=device)
    with pytest.raises(ValueError, match="does not cover the 30 draft ids"):
        greedy_pick(logits, torch.zeros(29, dtype=torch.long, device=device), embed_w)
    with pytest.raises(ValueError, match="contiguous"):
        greedy_pick(logits.t().contiguous().t(), torch.zeros(30, dtype=torch.long, device=device), embed_w)


def test_a_greedy_chain_on_the_pick_kernel_equals_the_torch_chain(monkeypatch):
    """A chain of 4 for 2 sequences of different prefixes: the same target tokens and the same draft cache
    from an EAGLE-3 head on the Triton kernels (one pick kernel per step) as from the plain torch head."""
    import toolkit.infer.kernels.greedy_pick as pick_module
    from toolkit.infer.config import ModelConfig
    from toolkit.infer.drafts import random_head
    from toolkit.infer.prepare import fuse_projections
    from toolkit.infer.tree import TreeConfig, draft_trees

    c = ModelConfig(model_type="llama", vocab_size=300, hidden_size=64, intermediate_size=96, num_layers=6,
                    num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=256)
    calls, real = [], pick_module.greedy_pick
    monkeypatch.setattr(pick_module, "greedy_pick", lambda *a, **k: calls.append(1) or real(*a, **k))
    g = torch.Generator().manual_seed(5)
    embed = torch.nn.Embedding(300, 64).to(device)
    prefix_emb, prefix_hidden = torch.randn(2, 6, 64, generator=g).to(device), torch.randn(2, 6, 192, generator=g)
    root_out, root_logp = torch.randn(2, 64, generator=g).to(device), torch.randn(2, 100, generator=g)
    outs = []
    for kernels in ("torch", "triton"):
        head = random_head(c, list(range(0, 300, 3)), seed=3).to(device)  # 100 draft ids: d2t is not zero
        fuse_projections(head)
        head.set_kernels(kernels)
        cache = head.new_cache(16, device=device, batch=2)
        with torch.no_grad():
            head(prefix_emb, prefix_hidden.to(device), torch.arange(6, device=device).expand(2, 6), cache)
            trees = draft_trees(head, embed, cache, [6, 4], [11, 12], root_out, root_logp.to(device).log_softmax(-1),
                                TreeConfig(num_steps=4, topk=1, num_draft_tokens=5))
        outs.append(([t.tokens.tolist() for t in trees], cache.k.clone(), cache.v.clone()))
    assert len(calls) == 4  # the root's pick and each of the 3 steps' (the last one without an embedding row)
    assert outs[0][0] == outs[1][0] and all(t % 3 == 0 for tree in outs[0][0] for t in tree[1:])
    for want, got in zip(outs[0][1:], outs[1][1:]):
        assert (want - got).abs().max() <= 1e-4
