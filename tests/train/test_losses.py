import math

import torch

from toolkit.train.losses import simulated_tau, ttt_loss


def naive(step_logits, target_logits, loss_mask, t2d, decay):
    B, L, _ = target_logits.shape
    ids = [int(i) for i in torch.nonzero(t2d).flatten()]
    total, accs = 0.0, []
    for i, logits in enumerate(step_logits):
        num, den, hits, tokens = 0.0, 0, 0, 0
        for b in range(B):
            for t in range(L - i - 2):
                tl = target_logits[b, t + i + 1]
                top = int(tl.argmax())
                tokens += bool(loss_mask[b, t + i + 2])  # accuracy: every assistant token, a miss if unreachable
                if not loss_mask[b, t + i + 2] or top not in ids:
                    continue
                p = tl[ids].softmax(-1)
                num += float(-(p * logits[b, t].log_softmax(-1)).sum())
                den += 1
                hits += int(ids[int(logits[b, t].argmax())] == top)
        total += decay ** i * (num / max(den, 1))
        accs.append(hits / max(tokens, 1))
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
    assert torch.allclose(accs, torch.tensor(want_accs), atol=1e-6)
    assert (counts > 0).all() and (counts[0] < counts[1]).all()  # some targets lie outside the draft vocabulary
    assert math.isclose(float(accs[0]), float(counts[0, 0] / counts[1, 0]), rel_tol=1e-6)  # hits where reachable


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
    assert losses.shape == accs.shape == (4,) and counts.shape == (2, 4)
    assert counts.tolist() == [[1, 0, 0, 0]] * 2 and losses[1:].abs().sum() == 0
    total.backward()


def test_eagle_regression_skips_the_steps_a_short_batch_has_no_row_for():
    """EAGLE-1/2 with 4 TTT steps over a micro-batch of 3 tokens (grouped by length, short rows batch together):
    its feature regression counts step 0's one row and skips the rest, as the token loss does, instead of a size
    mismatch that stopped the run."""
    from types import SimpleNamespace

    from toolkit.train.objectives import OBJECTIVES

    torch.manual_seed(0)
    V, H = 6, 4
    steps = [torch.randn(1, 3, V, requires_grad=True) for _ in range(4)]
    hidden = [torch.randn(1, 3, H, requires_grad=True) for _ in range(4)]
    feats, target, mask, t2d = torch.randn(1, 3, H), torch.randn(1, 3, V), torch.ones(1, 3), torch.ones(V, dtype=bool)
    cfg = SimpleNamespace(loss_decay=0.8, regression_weight=1.0, token_weight=0.1)
    total, _, _, counts = OBJECTIVES["eagle"].loss(cfg, steps, hidden, feats, target, mask, t2d)
    token = ttt_loss(steps, target, mask, t2d, 0.8)[0]
    regression = torch.nn.functional.smooth_l1_loss(hidden[0][:, :1], feats[:, 1:2])  # step 0: row 0 -> feature 1
    assert counts.tolist() == [[1, 0, 0, 0]] * 2
    assert torch.allclose(total, regression + 0.1 * token)



def _pair(seed: int, V: int, K: int):
    """Two micro-batches of different lengths and densities, and the one batch that holds both rows (padded)."""
    g = torch.Generator().manual_seed(seed)
    parts = []
    for L, ones in ((12, range(2, 12)), (7, (3, 5))):  # step 0 counts 10 tokens, then 2
        parts.append({"mask": torch.zeros(1, L, dtype=torch.long).index_fill_(1, torch.tensor(ones), 1),
                      "target": torch.randn(1, L, V, generator=g) * 2,
                      "steps": [torch.randn(1, L, V, generator=g) for _ in range(K)],
                      "hidden": [torch.randn(1, L, 5, generator=g) for _ in range(K)],
                      "feats": torch.randn(1, L, 5, generator=g)})

    def pad(x, L=12):
        return torch.cat([x, torch.zeros(x.shape[0], L - x.shape[1], *x.shape[2:], dtype=x.dtype)], 1)

    both = {k: torch.cat([pad(parts[0][k]), pad(parts[1][k])]) for k in ("mask", "target", "feats")}
    for k in ("steps", "hidden"):
        both[k] = [torch.cat([parts[0][k][i], pad(parts[1][k][i])]) for i in range(K)]
    return parts, both


def _grads(loss_fn, batches, norm):
    """d(loss)/d(step logits, step hidden) of each batch, accumulated the way accelerate does (loss / n)."""
    out = []
    for b in batches:
        steps = [s.clone().requires_grad_() for s in b["steps"]]
        hidden = [h.clone().requires_grad_() for h in b["hidden"]]
        (loss_fn(steps, hidden, b, norm) / len(batches)).backward()
        out.append((torch.stack([s.grad for s in steps]), torch.stack([h.grad if h.grad is not None else h * 0 for h in hidden])))
    return out


def test_accumulated_micro_batches_train_as_the_one_batch_that_holds_them():
    """Two micro-batches, 10 and 2 counted tokens: with the step-wide denominators (step_counts over both) their
    accumulated gradient is the gradient of one batch of both rows; a mean of micro-batch means (norm None)
    weighs each token of the short one 5x as much. Checked for the TTT loss and EAGLE-1/2's regression too."""
    from types import SimpleNamespace

    from toolkit.train.losses import step_counts
    from toolkit.train.objectives import OBJECTIVES

    V, K = 9, 3
    cfg = SimpleNamespace(loss_decay=0.8, regression_weight=1.0, token_weight=0.1)
    t2d = torch.ones(V, dtype=torch.bool)
    for name in ("eagle3", "eagle"):
        def loss_fn(steps, hidden, b, norm):
            return OBJECTIVES[name].loss(cfg, steps, hidden, b["feats"], b["target"], b["mask"], t2d, norm)[0]

        parts, both = _pair(0, V, K)
        [(want_s, want_h)] = _grads(loss_fn, [both], None)  # one batch, its own token means
        assert torch.equal(step_counts(both["mask"], K), step_counts(parts[0]["mask"], K) +
                           step_counts(parts[1]["mask"], K))
        norm = (step_counts(parts[0]["mask"], K) + step_counts(parts[1]["mask"], K)) / 2
        (a_s, a_h), (b_s, b_h) = _grads(loss_fn, parts, norm)
        assert torch.allclose(a_s, want_s[:, :1], atol=1e-7) and torch.allclose(b_s, want_s[:, 1:, :7], atol=1e-7)
        if name == "eagle":
            assert torch.allclose(a_h, want_h[:, :1], atol=1e-7) and torch.allclose(b_h, want_h[:, 1:, :7], atol=1e-7)
        (a_s, _), (b_s, _) = _grads(loss_fn, parts, None)  # the mean of means: not the one batch's gradient
        assert not torch.allclose(b_s, want_s[:, 1:, :7], atol=1e-4)


def test_the_step_wide_denominator_counts_assistant_tokens_the_draft_vocabulary_lacks():
    """With a reduced draft vocabulary a row whose target top-1 is outside it adds no loss but still counts in
    the denominator (it is known before the target runs); per-step logged losses stay this batch's means."""
    from toolkit.train.losses import step_counts

    parts, _ = _pair(1, 9, 2)
    b = parts[0]
    t2d = torch.ones(9, dtype=torch.bool)
    t2d[b["target"][0, 1].argmax()] = False  # position 2's target (step 0) is out of the vocabulary
    steps = [s[..., t2d] for s in b["steps"]]
    total, losses, _, counts = ttt_loss(steps, b["target"], b["mask"], t2d, 0.8, step_counts(b["mask"], 2))
    plain, plain_losses, _, _ = ttt_loss(steps, b["target"], b["mask"], t2d, 0.8)
    assert torch.equal(losses, plain_losses)
    assert counts[0, 0] < step_counts(b["mask"], 2)[0] and torch.equal(counts[1], step_counts(b["mask"], 2).long())
    want = sum(0.8 ** i * losses[i] * counts[0, i] / step_counts(b["mask"], 2)[i] for i in range(2))
    assert torch.allclose(total, want) and not torch.allclose(total, plain)
