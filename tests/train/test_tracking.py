"""Run logging (toolkit/train/tracking.py): a log window's per-TTT-step loss and accuracy are token means over its
micro-batches (not means of micro-batch means), its loss the mean of micro-batch losses, its epoch the ranks'
latest; metrics.jsonl keeps the last record per step when a resumed run logs a step again."""
import json
from types import SimpleNamespace

import pytest
import torch

from toolkit.train.tracking import Tracker, Window, read_metrics


class OneRank:
    """accelerate's reduce on a single process: the value itself."""
    device = torch.device("cpu")
    is_main_process = True

    def reduce(self, value, reduction):
        return value


def test_a_window_is_a_token_mean_over_its_micro_batches():
    w = Window()
    # micro-batch 1: 30 tokens at step 0 (loss 1.0), 10 at step 1 (loss 3.0); micro-batch 2: 10 and 30 tokens;
    # the accuracies over all assistant tokens, more than the loss's (targets outside the draft vocabulary)
    w.add(torch.tensor(5.0), torch.tensor([1.0, 3.0]), torch.tensor([0.5, 0.1]), torch.tensor([[30, 10], [40, 20]]), 40)
    w.add(torch.tensor(7.0), torch.tensor([2.0, 1.0]), torch.tensor([1.0, 0.3]), torch.tensor([[10, 30], [10, 30]]), 40)
    rec = w.record(OneRank(), epoch=2, lr=1e-3, grad_norm=None)
    assert rec["loss"] == pytest.approx(6.0)
    assert rec["loss_i"] == pytest.approx([(30 * 1.0 + 10 * 2.0) / 40, (10 * 3.0 + 30 * 1.0) / 40])
    a0, a1 = (40 * 0.5 + 10 * 1.0) / 50, (20 * 0.1 + 30 * 0.3) / 50
    assert rec["acc_i"] == pytest.approx([a0, a1])
    assert rec["simulated_tau"] == pytest.approx(1 + a0 + a0 * a1)
    assert rec["epoch"] == 2 and rec["lr"] == 1e-3 and rec["grad_norm"] is None
    assert rec["tokens_per_second"] > 0


def test_a_step_logged_twice_reads_as_its_last_record(tmp_path):
    cfg = SimpleNamespace(wandb_project=None)
    tracker = Tracker(OneRank(), tmp_path, cfg)
    for step, loss in ((10, 3.0), (20, 2.0), (20, 1.5), (30, 1.0)):  # step 20 again after a resume
        tracker.log(step, {"loss": loss})
    tracker.log(20, {"eval_engine_tau": 1.7})
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 5
    recs = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["step"], r.get("loss"), r.get("eval_engine_tau")) for r in recs] == [
        (10, 3.0, None), (20, 1.5, None), (20, None, 1.7), (30, 1.0, None)]
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0]) == {"step": 10, "loss": 3.0}
