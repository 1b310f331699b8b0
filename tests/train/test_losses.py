import math

import torch

from toolkit.train.losses import simulated_tau, ttt_loss


def naive(step_logits, target_logits, loss_mask, t2d, decay):
    B, L, _ = target_logits.shape
    ids = [int(i) for i in torch.nonzero(t2d).flatten()]
    total, accs = 0.0, []
    for i, logits in enumerate(step_logits):
        num, den, hits = 0.0, 0, 0
        for b in range(B):
            for t in range(L - i - 2):
                tl = target_logits[b, t + i + 1]
                top = int(tl.argmax())
                if not loss_mask[b, t + i + 2] or top not in ids:
                    continue
                p = tl[ids].softmax(-1)
                num += float(-(p * logits[b, t].log_softmax(-1)).sum())
                den += 1
                hits += int(ids[int(logits[b, t].argmax())] == top)
        total += decay ** i * (num / max(den, 1))
        accs.append(hits / max(den, 1))
    return total, accs


def test_loss_and_accuracy_equal_a_per_row_loop():
    g = torch.Generator().manual_seed(0)
    B, L, V = 2, 11, 30
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[torch.randperm(V, generator=g)[:18]] = True
    target = torch.randn(B, L, V, generator=g) * 2
    mask = torch.rand(B, L, generator=g) > 0.3
    steps = [torch.randn(B, L, 18, generator=g) for _ in range(4)]
    steps[0] = target[:, 1:, t2d]  # step 0 copies the target: accuracy 1 where counted
    steps[0] = torch.cat([steps[0], torch.zeros(B, 1, 18)], 1)
    loss, losses, accs, counts = ttt_loss(steps, target, mask, t2d)
    want_loss, want_accs = naive(steps, target, mask, t2d, 0.8)
    assert math.isclose(float(loss), want_loss, rel_tol=1e-5)
    assert torch.allclose(accs, torch.tensor(want_accs), atol=1e-6) and float(accs[0]) == 1.0
    assert (counts > 0).all()


def test_simulated_tau_counts_the_bonus_token():
    assert simulated_tau(torch.tensor([0.0, 0.9])) == 1.0
    assert math.isclose(simulated_tau(torch.tensor([0.8, 0.5, 0.5])), 1 + 0.8 + 0.4 + 0.2, rel_tol=1e-6)


def test_a_batch_shorter_than_the_unroll_gives_every_step_an_entry():
    """3 tokens and 4 TTT steps: steps 1.. have no token to predict; they count zero rows (not a shorter list,
    which the trainer's per-step sums across micro-batches cannot add)."""
    import torch

    from toolkit.train.losses import ttt_loss

    torch.manual_seed(0)
    V = 6
    steps = [torch.randn(1, 3, V, requires_grad=True) for _ in range(4)]
    total, losses, accs, counts = ttt_loss(steps, torch.randn(1, 3, V), torch.ones(1, 3), torch.ones(V, dtype=torch.bool))
    assert losses.shape == accs.shape == counts.shape == (4,)
    assert counts.tolist() == [1, 0, 0, 0] and losses[1:].abs().sum() == 0
    total.backward()
