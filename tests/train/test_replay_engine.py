"""The replayed acceptance of training's evaluation equals what the engine accepts, verify step for verify
step, for every head kind (EAGLE-3, MTP, EAGLE-1/2), on heads trained far enough that the engine accepts."""
from __future__ import annotations

import pytest

from toolkit.cli import main
from toolkit.train.tracking import read_metrics


@pytest.mark.parametrize("head", ["eagle3", "mtp", "eagle"])
def test_replayed_acceptance_equals_the_engine(tiny_target, prepared, tmp_path, head):
    out = tmp_path / head
    assert main(["train", "--model", str(tiny_target), "--data", str(prepared), "--output-dir", str(out),
                 f"head={head}", "batch_size=2", "max_len=96", "eval_samples=3", "eval_max_new_tokens=40",
                 "threads=1", "lr=1e-2", "warmup_ratio=0", "max_steps=60", "ttt_steps=3", "log_every=60",
                 "save_every=60", "mixed_precision=no"]) == 0
    ev = [r for r in read_metrics(out / "metrics.jsonl") if "eval_engine_tau" in r][-1]
    assert ev["eval_engine_tau"] > 1.0  # some verify steps accept (1.04-1.09 here): not two all-zero sequences
    assert ev["eval_replay_differing_rows"] == 0 and ev["eval_replayed_tau"] == ev["eval_engine_tau"]
