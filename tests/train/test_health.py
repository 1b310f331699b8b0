"""A run whose numbers leave the float range stops, saying so: fp16's loss scaler skipping every step, or a nan
loss without one; and a run resumed under fp16 from a checkpoint written in another precision (no loss scale saved)
starts its scale afresh instead of failing on the missing file."""
import pytest
import torch

from toolkit.cli import main
from toolkit.train.health import MAX_SKIPPED, Health


class Opt:
    def __init__(self, skipped):
        self.step_was_skipped = skipped


def test_steps_skipped_in_a_row_stop_the_run_and_a_few_do_not():
    h = Health(scaler=True)
    for _ in range(MAX_SKIPPED - 1):  # the scaler finding its scale, then a step taken
        h.after_step(Opt(True))
    h.after_step(Opt(False))
    rec = {"loss": float("nan")}
    h.check(rec, 60)  # a nan loss under a scaler: that step was skipped, the weights did not move
    assert rec["skipped_steps"] == MAX_SKIPPED - 1 and h.in_a_row == 0
    for _ in range(MAX_SKIPPED - 1):
        h.after_step(Opt(True))
    with pytest.raises(RuntimeError, match=rf"^{MAX_SKIPPED} optimizer steps in a row were skipped: the fp16 loss "
                                           r"scaler .* mixed_precision=no and dtype=float32"):
        h.after_step(Opt(True))


def test_a_nan_loss_without_a_scaler_stops_the_run():
    h = Health(scaler=False)
    h.after_step(Opt(False))
    rec = {"loss": 1.5}
    h.check(rec, 10)
    assert "skipped_steps" not in rec
    with pytest.raises(RuntimeError, match=r"^the loss is nan in the steps logged at step 20: the weights are nan"):
        h.check({"loss": float("nan")}, 20)


def test_the_trainer_stops_at_the_first_logged_nan_loss(tiny_target, prepared, tmp_path, monkeypatch, capsys):
    """A forward that overflowed, simulated: the loss turns nan from step 3; with log_every 1 the run stops there,
    before the checkpoint of step 3 is written (the one of step 2 stays the newest)."""
    import toolkit.train.objectives as objectives

    real, calls = objectives.ttt_loss, []

    def overflowing(*args, **kwargs):
        loss, *rest = real(*args, **kwargs)
        calls.append(1)
        return (loss * float("nan") if len(calls) > 2 else loss), *rest

    monkeypatch.setattr(objectives, "ttt_loss", overflowing)
    out = tmp_path / "run"
    rc = main(["train", "--model", str(tiny_target), "--data", str(prepared), "--output-dir", str(out),
               "batch_size=2", "max_len=96", "log_every=1", "save_every=1", "max_steps=6", "eval_samples=2",
               "eval_every=0", "threads=1", "mixed_precision=no"])
    assert rc != 0
    assert "the loss is nan in the steps logged at step 3" in capsys.readouterr().err
    assert max(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*")) == 2


def test_a_resume_under_fp16_from_a_checkpoint_without_a_loss_scale(tmp_path, capsys):
    from accelerate import Accelerator

    from toolkit.train import checkpoint as ckpt

    acc = Accelerator(cpu=True)  # no scaler: what a bf16 / fp32 run saves
    model, opt = acc.prepare(torch.nn.Linear(4, 4), torch.optim.AdamW(torch.nn.Linear(4, 4).parameters()))
    acc.save_state(str(tmp_path / "ckpt"))
    assert not (tmp_path / "ckpt" / "scaler.pt").exists()
    scaler = torch.amp.GradScaler("cpu")
    acc.scaler = scaler  # as an fp16 launch has one
    with pytest.raises(FileNotFoundError):  # what accelerate alone does
        acc.load_state(str(tmp_path / "ckpt"))
    ckpt.load(acc, tmp_path / "ckpt")
    assert acc.scaler is scaler and "the loss scale starts afresh" in capsys.readouterr().out
    acc.save_state(str(tmp_path / "fp16"))  # written with the scale: read back as it was
    ckpt.load(acc, tmp_path / "fp16")
    assert "afresh" not in capsys.readouterr().out
