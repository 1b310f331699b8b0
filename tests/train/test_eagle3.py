"""EAGLE-3 training end to end on a tiny random target: export, evaluation, exact resume after a kill,
online == offline, refusals, wandb offline."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from toolkit.cli import main
from toolkit.train.tracking import read_metrics

ROOT = Path(__file__).resolve().parents[2]
COMMON = ["batch_size=2", "max_len=96", "log_every=1", "eval_samples=2", "eval_max_new_tokens=6", "threads=1",
          "lr=3e-3", "warmup_ratio=0", "mixed_precision=no"]  # fp32 on any CPU: auto would time bf16 first


def train(tiny_target, prepared, out, *extra, flags=()):
    return main(["train", "--model", str(tiny_target), "--data", str(prepared), "--output-dir", str(out), *flags,
                 *COMMON, *extra])


def losses(out):
    return {r["step"]: r["loss"] for r in read_metrics(Path(out) / "metrics.jsonl") if "loss" in r}


def test_training_lowers_the_loss_and_exports_a_draft_the_engine_loads(tiny_target, prepared, tmp_path):
    from toolkit.infer.drafts import load_eagle3
    from toolkit.infer.config import ModelConfig

    out = tmp_path / "run"
    assert train(tiny_target, prepared, out, "max_steps=16", "save_every=8") == 0
    seen = losses(out)
    assert sorted(seen) == list(range(1, 17)) and seen[16] < 0.8 * seen[1]
    recs = read_metrics(out / "metrics.jsonl")
    last = [r for r in recs if "loss" in r][-1]
    assert len(last["acc_i"]) == 7 and last["simulated_tau"] >= 1 and last["tokens_per_second"] > 0
    # the logged lr is the one each step trained at: the full rate at step 1 (no warm-up), > 0 at the last
    lrs = [r["lr"] for r in recs if "loss" in r]
    assert lrs[0] == pytest.approx(3e-3) and 0 < lrs[-1] < lrs[0]
    ev = [r for r in recs if "eval_engine_tau" in r][-1]
    assert ev["eval_engine_tau"] >= 1 and ev["eval_simulated_tau"] >= 1
    # training's unrolled head, replayed over the engine's own answers, accepts what the engine accepted
    assert ev["eval_replay_differing_rows"] == 0 and ev["eval_replayed_tau"] == ev["eval_engine_tau"]
    cfg = json.loads((out / "draft" / "config.json").read_text())
    assert cfg["toolkit"]["target"] == str(tiny_target) and cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    head = load_eagle3(out / "draft", ModelConfig.from_folder(tiny_target))
    assert len(head.d2t) == cfg["draft_vocab_size"] and (out / f"vocab_map_{len(head.d2t)}.safetensors").is_file()
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-16", "checkpoint-8"]
    # the lm_head starts as the target's rows of the draft vocabulary (the flag's other value: random)
    from safetensors.torch import load_file

    w = load_file(str(tiny_target / "model.safetensors"))["lm_head.weight"]
    out2 = tmp_path / "init"
    assert train(tiny_target, prepared, out2, "max_steps=1", "lr=1e-12", "save_every=1") == 0
    h2 = load_eagle3(out2 / "draft", ModelConfig.from_folder(tiny_target))
    ids = torch.arange(len(h2.d2t)) + h2.d2t
    assert torch.allclose(h2.lm_head.weight, w[ids].to(torch.bfloat16).float(), atol=1e-2)


def test_bf16_autocast_on_a_cpu_trains_like_fp32_and_evaluates_in_fp32(tiny_target, prepared, tmp_path):
    # an explicit bf16 on a CPU (kept even where it is emulated: cpu_speed warns); the head trains under autocast
    # and the target runs in bf16
    steps = ["max_steps=12", "save_every=12"]
    assert train(tiny_target, prepared, tmp_path / "fp32", *steps, "mixed_precision=no") == 0
    # its own process: accelerate keeps one precision per process
    run = subprocess.run([sys.executable, str(ROOT / "toolkit/train/eagle3.py"), "--model", str(tiny_target),
                          "--data", str(prepared), "--output-dir", str(tmp_path / "bf16"), *COMMON, *steps,
                          "mixed_precision=bf16"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "mixed precision bf16" in run.stdout
    a, b = losses(tmp_path / "fp32"), losses(tmp_path / "bf16")
    assert a[1] != b[1], "bf16 changed nothing: autocast did not apply"
    assert abs(a[1] - b[1]) <= 0.01 * a[1]  # the same weights: bf16 rounding only
    late_a, late_b = (sum(x[s] for s in range(9, 13)) / 4 for x in (a, b))  # lr 3e-3 on a tiny head: paths part
    assert late_b < 0.25 * b[1] and abs(late_a - late_b) <= 0.15 * late_a, (a, b)
    # the held-out evaluation serves as `toolkit bench` does on a CPU (fp32): replayed == engine still holds
    ev = [r for r in read_metrics(tmp_path / "bf16" / "metrics.jsonl") if "eval_engine_tau" in r][-1]
    assert ev["eval_replay_differing_rows"] == 0 and ev["eval_replayed_tau"] == ev["eval_engine_tau"] >= 1
    from safetensors.torch import load_file

    assert all(v.dtype != torch.float16 for v in load_file(str(tmp_path / "bf16/draft/model.safetensors")).values())


def test_resume_after_a_kill_continues_exactly(tiny_target, prepared, tmp_path):
    steps = ["max_steps=30", "save_every=3"]
    whole = tmp_path / "whole"
    assert train(tiny_target, prepared, whole, *steps) == 0
    cut = tmp_path / "cut"
    cmd = [sys.executable, str(ROOT / "toolkit/train/eagle3.py"), "--model", str(tiny_target), "--data",
           str(prepared), "--output-dir", str(cut), *COMMON, *steps]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not (cut / "checkpoint-6").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)  # no chance to clean up
    proc.wait()
    saved = max(int(p.name.split("-")[1]) for p in cut.glob("checkpoint-*"))
    assert 6 <= saved < 30, "the run finished before it could be killed"
    assert subprocess.run(cmd + ["--resume"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE).returncode == 0
    a, b = losses(whole), losses(cut)
    later = [s for s in a if s > saved]
    assert later and all(abs(a[s] - b[s]) <= 1e-5 for s in later), [(s, a[s], b[s]) for s in later]
    # the exported drafts are the same weights
    from safetensors.torch import load_file

    wa, wb = load_file(str(whole / "draft/model.safetensors")), load_file(str(cut / "draft/model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-5), ("bfloat16", 2e-2)])
def test_offline_shards_give_the_online_loss(tiny_target, prepared, tmp_path, dtype, tol):
    shards = tmp_path / "hidden"
    assert main(["dump-hidden-states", "--model", str(tiny_target), "--data", str(prepared), "--out", str(shards),
                 "--max-len", "96", "--shard-size", "7", "--dtype", dtype]) == 0
    index = json.loads((shards / "index.json").read_text())
    assert index["num_samples"] == 24 and len(index["shards"]) == 4 and index["dtype"] == dtype
    assert train(tiny_target, prepared, tmp_path / "on", "max_steps=3", "save_every=3") == 0
    assert train(tiny_target, prepared, tmp_path / "off", "max_steps=3", "save_every=3",
                 f"hidden_states={shards}") == 0
    on, off = losses(tmp_path / "on"), losses(tmp_path / "off")
    assert all(abs(on[s] - off[s]) <= tol * abs(on[s]) for s in on), (on, off)


def test_offline_training_refuses_shards_dumped_from_other_data(tiny_target, prepared, tmp_path, capsys):
    """Shards carry their own tokens: another prepared dataset of as many rows (re-prepared, or edited) would train
    on the old data without a word. Its rows' lengths, and a few rows' tokens, must match."""
    import shutil

    import datasets

    shards = tmp_path / "hidden"
    assert main(["dump-hidden-states", "--model", str(tiny_target), "--data", str(prepared), "--out", str(shards),
                 "--max-len", "96", "--shard-size", "12"]) == 0
    ds = datasets.load_from_disk(str(prepared))
    for name, change in (("shorter", lambda r: {"input_ids": r["input_ids"][:-1], "loss_mask": r["loss_mask"][:-1],
                                                "num_tokens": r["num_tokens"] - 1}),
                         ("edited", lambda r: {"input_ids": [r["input_ids"][0], (r["input_ids"][1] + 1) % 300,
                                                             *r["input_ids"][2:]]})):
        other = tmp_path / name
        ds.map(change).save_to_disk(str(other))
        shutil.copy(prepared / "toolkit_prepare.json", other)
        capsys.readouterr()
        assert train(tiny_target, other, tmp_path / f"off_{name}", "max_steps=1", f"hidden_states={shards}") == 2
        err = capsys.readouterr().err
        assert f"were not dumped from {other}" in err and ("tokens there" in err if name == "shorter" else
                                                           "other tokens there" in err), err


def test_shards_dumped_shorter_than_training_are_refused_for_their_length(tiny_target, prepared, tmp_path, capsys):
    """The rows of a shorter dump are shorter than the data's: that was reported as shards of another dataset."""
    shards = tmp_path / "hidden"
    assert main(["dump-hidden-states", "--model", str(tiny_target), "--data", str(prepared), "--out", str(shards),
                 "--max-len", "24", "--shard-size", "12"]) == 0
    capsys.readouterr()
    assert train(tiny_target, prepared, tmp_path / "off", "max_steps=1", f"hidden_states={shards}") == 2
    err = capsys.readouterr().err
    assert "were dumped with max_len 24, training has max_len 96" in err, err


def test_a_dump_into_shards_of_another_setup_names_what_differs(tiny_target, prepared, tmp_path, capsys,
                                                                monkeypatch):
    shards = tmp_path / "hidden"
    args = ["dump-hidden-states", "--model", str(tiny_target), "--data", str(prepared), "--out", str(shards),
            "--shard-size", "12"]
    assert main([*args, "--max-len", "96"]) == 0
    capsys.readouterr()
    assert main([*args, "--max-len", "64"]) == 2
    err = capsys.readouterr().err
    assert "holds shards of another setup (max_len 96 there, 64 now); use a new folder" in err, err
    # the same data and target, named another way (a relative path, a trailing /.): the same setup, resumed
    monkeypatch.chdir(prepared.parent)
    again = ["dump-hidden-states", "--model", f"{tiny_target}/.", "--data", prepared.name, "--out", str(shards),
             "--shard-size", "12", "--max-len", "96"]
    assert main(again) == 0, capsys.readouterr().err


def test_a_killed_dump_leaves_no_half_shard_and_resumes_with_another_shard_size(tiny_target, prepared, tmp_path,
                                                                             monkeypatch):
    """A dump killed while writing its third shard keeps the two finished ones and no partial file; resumed with
    another --shard-size it dumps every row the index does not list yet (not from 3 x the new size on)."""
    import safetensors.torch

    from toolkit.train.data import HiddenStateShards

    shards, real, calls = tmp_path / "hidden", safetensors.torch.save_file, []

    def save_file(tensors, path):
        calls.append(path)
        if len(calls) == 3:  # killed halfway through the file
            Path(path).write_bytes(b"\0" * 100)
            raise KeyboardInterrupt
        return real(tensors, path)

    args = ["dump-hidden-states", "--model", str(tiny_target), "--data", str(prepared), "--out", str(shards),
            "--max-len", "96", "--dtype", "float32"]
    monkeypatch.setattr(safetensors.torch, "save_file", save_file)
    assert main([*args, "--shard-size", "7"]) == 130  # interrupted
    monkeypatch.undo()
    assert sorted(p.name for p in shards.iterdir()) == ["index.json", "shard-00000.safetensors",
                                                        "shard-00001.safetensors"]
    assert json.loads((shards / "index.json").read_text())["num_samples"] == 14
    assert main([*args, "--shard-size", "10"]) == 0
    index = json.loads((shards / "index.json").read_text())
    assert [(s["first_sample"], s["num_samples"]) for s in index["shards"]] == [(0, 7), (7, 7), (14, 10)]
    assert index["num_samples"] == 24 and HiddenStateShards(shards, 96).covers(24)


def test_refusals_name_the_problem(tiny_target, prepared, tmp_path, capsys):
    out = tmp_path / "run"
    assert train(tiny_target, prepared, out, "max_steps=1") == 0
    capsys.readouterr()
    assert train(tiny_target, prepared, out, "max_steps=1") == 2
    assert "holds a previous run; pass --resume" in capsys.readouterr().err
    assert train(tiny_target, prepared, out, "max_steps=2", "draft_vocab_size=512", flags=["--resume"]) == 2
    assert "cannot resume: the draft/target differ" in capsys.readouterr().err
    assert train(tiny_target, prepared, out, "max_steps=1", flags=["--overwrite"]) == 0
    # --overwrite with bad data deleted the previous run before the data was found missing: it now stays whole
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    assert train(tiny_target, tmp_path / "nothing", out, "max_steps=1", flags=["--overwrite"]) == 2
    assert "nothing: no such folder" in capsys.readouterr().err
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before and (out / "draft").is_dir()
    assert train(tiny_target, tmp_path, tmp_path / "x", "max_steps=1") == 2
    assert "not a prepared dataset" in capsys.readouterr().err
    assert train(tiny_target, tmp_path / "prepare", tmp_path / "x", "max_steps=1") == 2  # a typo
    assert "prepare: no such folder; run `toolkit prepare-data" in capsys.readouterr().err
    assert train(tiny_target, prepared, tmp_path / "y", "eval_samples=24") == 2
    assert "leaves no training rows" in capsys.readouterr().err
    # answers all past max_len: a run that learned nothing (loss 0.000) at 20, a traceback at 2, and a half-written
    # output_dir that the next run refused
    for n in (20, 2):
        assert train(tiny_target, prepared, tmp_path / f"short{n}", f"max_len={n}", "eval_samples=0") == 2
        assert f"max_len {n}: no training row of" in capsys.readouterr().err
        assert not (tmp_path / f"short{n}" / "run.json").exists()


def test_an_interrupt_during_a_checkpoint_save_leaves_no_half_written_folder(tiny_target, prepared, tmp_path,
                                                                            monkeypatch, capsys):
    """Ctrl-C while a checkpoint was written left its .checkpoint-N.tmp folder (tens of MB) while the CLI said
    nothing half-written was left behind; the interrupted save's folder is removed first."""
    from toolkit.train import checkpoint

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint, "export_draft", interrupted)
    out = tmp_path / "run"
    assert train(tiny_target, prepared, out, "max_steps=2", "save_every=1") == 130
    assert "nothing half-written was left behind" in capsys.readouterr().err
    assert not list(out.glob(".*.tmp")) and not list(out.glob("checkpoint-*"))


def test_contradictory_flags_and_a_file_as_output_dir_are_refused_before_loading(tmp_path, capsys):
    """--resume --overwrite deleted the run and then started afresh without a word; an output_dir that is a file
    failed with FileExistsError's traceback after the target and data had loaded."""
    (tmp_path / "f").write_text("x")
    assert main(["train", "--data", "x", "--output-dir", str(tmp_path / "run"), "--resume", "--overwrite"]) == 2
    assert "give one of them" in capsys.readouterr().err
    assert main(["train", "--data", "x", "--output-dir", str(tmp_path / "f")]) == 2
    assert f"output_dir {tmp_path / 'f'} is a file" in capsys.readouterr().err
    assert (tmp_path / "f").read_text() == "x" and not (tmp_path / "run").exists()


@pytest.mark.parametrize("extra, message", [
    (["--out", "FILE"], "is a file; give a folder for the shards"),
    (["--aux-layers", "a,b"], "--aux-layers 'a,b': give 3 comma-separated layer ids"),
    (["--max-len", "0"], "--max-len 0: give the tokens per sample"), (["--threads", "-1"], "--threads -1")])
def test_bad_dump_options_are_named_before_loading(tmp_path, capsys, extra, message):
    """--out FILE failed with FileExistsError's traceback after the target had run, --aux-layers a,b said only
    'invalid literal for int()', --max-len 0 'the dataset is empty', --threads -1 named no option."""
    (tmp_path / "FILE").write_text("x")
    extra = [str(tmp_path / x) if x == "FILE" else x for x in extra]
    args = ["dump-hidden-states", "--data", str(tmp_path / "nowhere"), *extra]
    assert main(args if "--out" in extra else [*args, "--out", str(tmp_path / "shards")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "shards").exists() and (tmp_path / "FILE").read_text() == "x"


def test_dump_aux_layers_out_of_range_name_the_range_the_next_check_accepts(tiny_target, prepared, tmp_path, capsys):
    """The message gave 0..L-1, and L-1 was then refused as the last layer (SGLang and vLLM never reach it)."""
    layers = json.loads((tiny_target / "config.json").read_text())["num_hidden_layers"]
    args = ["dump-hidden-states", "--model", str(tiny_target), "--data", str(prepared), "--out", str(tmp_path / "h")]
    assert main([*args, "--aux-layers", f"1,2,{layers}"]) == 2
    assert f"give 3 increasing layer ids in 0..{layers - 2}" in capsys.readouterr().err
    assert main([*args, "--aux-layers", f"1,2,{layers - 1}"]) == 2
    assert f"ids must be <= {layers - 2}" in capsys.readouterr().err


def test_a_resume_keeps_the_runs_data_batch_optimizer_and_process_count(tiny_target, prepared, tmp_path, capsys):
    """The optimizer's saved state would restore the old lr over a new one, and another batch shape or number of
    processes would skip the wrong rows and resume the schedule elsewhere on its curve: refused, each named."""
    out = tmp_path / "run"
    assert train(tiny_target, prepared, out, "max_steps=1", "save_every=1") == 0
    capsys.readouterr()
    assert train(tiny_target, prepared, out, "max_steps=2", "lr=1e-3", "grad_accum=2", flags=["--resume"]) == 2
    err = capsys.readouterr().err
    assert "grad_accum was 1, now 2" in err and "lr was 0.003, now 0.001" in err and "max_steps was" not in err
    # the checkpoint of a run launched on 2 processes (batch_size 2 x grad_accum 1 x 2 = 4 rows a step)
    saved = out / "checkpoint-1" / "custom_checkpoint_0.pkl"
    state = torch.load(saved, weights_only=False)
    assert state == {"step": 1, "tokens": state["tokens"], "rows_per_step": 2,
                     "launch": {"processes": 1, "zero_stage": None}}
    torch.save({**state, "rows_per_step": 4, "launch": {}}, saved)  # one from before the launch was saved
    assert train(tiny_target, prepared, out, "max_steps=2", flags=["--resume"]) == 2
    assert "its steps took 4 rows each" in capsys.readouterr().err
    # ZeRO-3 on 2 ranks: accelerate and DeepSpeed failed on a missing pytorch_model.bin or a tensor size instead
    torch.save({**state, "rows_per_step": 4, "launch": {"processes": 2, "zero_stage": 3, "precision": "bf16"}}, saved)
    assert train(tiny_target, prepared, out, "max_steps=2", flags=["--resume"]) == 2
    assert ("written by 2 process(es) under DeepSpeed ZeRO-3 in bf16, this launch runs 1 process(es) without "
            "DeepSpeed" in capsys.readouterr().err)
    torch.save({"step": 1, "tokens": state["tokens"]}, saved)  # a checkpoint from before the count was saved
    assert train(tiny_target, prepared, out, "max_steps=2", flags=["--resume"]) == 0  # a longer run: allowed
    assert sorted(losses(out)) == [1, 2]


def test_wandb_logs_offline(tiny_target, prepared, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    assert train(tiny_target, prepared, out, "max_steps=2", "wandb_project=toolkit-test") == 0
    runs = list((out / "wandb").glob("offline-run-*"))
    assert runs and any(f.suffix == ".wandb" for f in runs[0].iterdir())


def test_wandb_without_a_key_is_refused_before_the_run_is_written(tiny_target, prepared, tmp_path, monkeypatch,
                                                                   capsys):
    """wandb's UsageError traceback once left run.json behind, and the next run was refused as a previous one."""
    import wandb

    wandb.teardown()  # an earlier test's offline setup lives on in wandb's process-wide singleton
    for var in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc login
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    out = tmp_path / "run"
    assert train(tiny_target, prepared, out, "max_steps=1", "wandb_project=toolkit-test") == 2
    assert "a tracker could not start" in capsys.readouterr().err
    assert not (out / "run.json").exists()


def test_tensorboard_logs_each_step_under_the_output_dir(tiny_target, prepared, tmp_path, capsys):
    """report_to (SpecForge's report-to, accelerate's trackers): tensorboard's event file holds every logged step's
    loss and per-TTT-step accuracy; a tracker accelerate does not know is refused by name."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "tb"
    assert train(tiny_target, prepared, out, "max_steps=3", "report_to=[tensorboard]") == 0
    (events,) = (out / "runs" / "tb").glob("events.out.tfevents.*")  # the project: output_dir's name
    acc = EventAccumulator(str(events.parent))
    acc.Reload()
    assert [e.step for e in acc.Scalars("loss")] == [1, 2, 3] and "acc_i/6" in acc.Tags()["scalars"]
    assert not (out / "wandb").exists()
    assert train(tiny_target, prepared, tmp_path / "x", "max_steps=1", "report_to=[tensorbored]") == 2
    import importlib.util

    absent = next((t for t in ("mlflow", "aim", "clearml", "dvclive") if importlib.util.find_spec(t) is None), None)
    if absent is not None:  # accelerate drops a tracker whose package is missing, with a debug line only
        assert train(tiny_target, prepared, tmp_path / "y", "max_steps=1", f"report_to={absent}") == 2
        assert f"report_to ['{absent}']: not started" in capsys.readouterr().err
        assert not (tmp_path / "y" / "run.json").exists()


def test_a_two_layer_head_trains_and_exports(tiny_target, prepared, tmp_path):
    from toolkit.infer.config import ModelConfig
    from toolkit.infer.drafts import load_eagle3

    out = tmp_path / "run"
    assert train(tiny_target, prepared, out, "max_steps=2", "num_layers=2", "ttt_steps=3") == 0
    head = load_eagle3(out / "draft", ModelConfig.from_folder(tiny_target))
    assert len(head.additional_layers) == 1
    assert [len(r["acc_i"]) for r in read_metrics(out / "metrics.jsonl") if "acc_i" in r][0] == 3


def test_max_minutes_stops_saves_evaluates_and_exports_then_resume_finishes(tiny_target, prepared, tmp_path, capsys):
    out = tmp_path / "timed"
    # 0.0001 min (6 ms) has passed after the first step: the run ends there as if it were the last step
    assert train(tiny_target, prepared, out, "max_steps=40", "save_every=100", "max_minutes=0.0001") == 0
    assert "max_minutes 0.0001 reached at step 1 of 40" in capsys.readouterr().out
    recs = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in recs if "loss" in r] == [1]
    assert [r["step"] for r in recs if "eval_engine_tau" in r] == [1]  # the final evaluation ran
    assert (out / "checkpoint-1").is_dir() and (out / "draft" / "model.safetensors").is_file()
    assert train(tiny_target, prepared, out, "max_steps=3", "save_every=100", flags=["--resume"]) == 0
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl") if "loss" in r] == [1, 2, 3]
    assert train(tiny_target, prepared, tmp_path / "bad", "max_minutes=0") == 2
    assert "max_minutes 0.0: must be > 0" in capsys.readouterr().err


def test_init_from_a_trained_draft_starts_from_its_weights_and_vocabulary(tiny_target, prepared, tmp_path, capsys):
    from safetensors.torch import load_file

    first = tmp_path / "first"
    assert train(tiny_target, prepared, first, "max_steps=12", "save_every=12", "draft_vocab_size=20000") == 0
    # lr 1e-12: the one optimizer step moves nothing, so the export shows where the run started
    again = tmp_path / "again"
    assert train(tiny_target, prepared, again, "max_steps=1", "lr=1e-12", "save_every=1",
                 f"init_from={first / 'draft'}") == 0
    fresh = tmp_path / "fresh"
    assert train(tiny_target, prepared, fresh, "max_steps=1", "lr=1e-12", "save_every=1",
                 "draft_vocab_size=20000") == 0
    wa, wb, wf = (load_file(str(d / "draft/model.safetensors")) for d in (first, again, fresh))
    assert set(wa) == set(wb) and all(torch.allclose(wa[k].float(), wb[k].float(), atol=1e-2) for k in wa)
    assert not torch.allclose(wa["fc.weight"].float(), wf["fc.weight"].float(), atol=1e-2)
    # the started-from head keeps its own 20,000-id vocabulary (the recipe's default would take the whole vocab)
    assert json.loads((again / "draft/config.json").read_text())["draft_vocab_size"] == 20000
    assert torch.equal(wa["d2t"], wb["d2t"])
    # and starts where the first run ended: a lower first loss than a fresh head's
    assert losses(again)[1] < 0.9 * losses(fresh)[1]
    capsys.readouterr()
    draft = f"init_from={first / 'draft'}"
    assert train(tiny_target, prepared, tmp_path / "x1", "max_steps=1", draft, "num_layers=2") == 2
    assert "does not fit the head this recipe builds" in capsys.readouterr().err
    assert train(tiny_target, prepared, tmp_path / "x2", "max_steps=1", draft, "head=eagle") == 2
    assert "holds an eagle3 draft, but the recipe trains an eagle head" in capsys.readouterr().err
    assert train(tiny_target, prepared, tmp_path / "x3", "max_steps=1", draft, "aux_layers=[0,1,2]") == 2
    assert "init_from" in capsys.readouterr().err
    assert train(tiny_target, prepared, tmp_path / "x4", "max_steps=1", f"init_from={tmp_path}") == 2
    assert "no config.json there" in capsys.readouterr().err


def test_a_resume_from_a_checkpoint_between_log_lines_keeps_the_token_count(tiny_target, prepared, tmp_path):
    """Checkpoints every 2 steps, log lines every 4: a run resumed from checkpoint-2 (before any log line) ends with
    the token count of the run that was never stopped."""
    import shutil

    steps = ["max_steps=8", "save_every=2", "log_every=4", "keep_checkpoints=10"]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert train(tiny_target, prepared, whole, *steps) == 0
    assert train(tiny_target, prepared, cut, *steps) == 0
    for k in (4, 6, 8):  # as if killed right after checkpoint-2 was written
        shutil.rmtree(cut / f"checkpoint-{k}")
    assert train(tiny_target, prepared, cut, *steps, flags=["--resume"]) == 0
    final = [[r for r in read_metrics(p / "metrics.jsonl") if "loss" in r][-1] for p in (whole, cut)]
    assert final[0]["step"] == final[1]["step"] == 8 and final[0]["tokens"] == final[1]["tokens"] > 0


def test_rows_beyond_a_sliding_window_give_transformers_windowed_features(tiny_target, prepared, tmp_path):
    """The target runs without a KV cache in training and in dump-hidden-states, over whole rows: a Mistral whose
    sliding_window (16) is shorter than the rows attends within it there too. The dumped features equal
    transformers' hidden states, and training runs on them."""
    import json
    import shutil

    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from toolkit.cli import main

    mistral = tmp_path / "mistral"
    shutil.copytree(tiny_target, mistral)
    cfg = json.loads((mistral / "config.json").read_text())
    cfg.update(model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=16)
    (mistral / "config.json").write_text(json.dumps(cfg))
    assert main(["dump-hidden-states", "--model", str(mistral), "--data", str(prepared), "--out",
                 str(tmp_path / "hs"), "--dtype", "float32", "--shard-size", "4"]) == 0
    index = json.loads((tmp_path / "hs" / "index.json").read_text())
    shard = load_file(str(tmp_path / "hs" / index["shards"][-1]["file"]))  # the longest rows come last
    lo, hi = int(shard["offsets"][-2]), int(shard["offsets"][-1])
    assert hi - lo > 16
    ref = AutoModelForCausalLM.from_pretrained(mistral, dtype=torch.float32).eval()
    with torch.no_grad():
        want = ref(shard["input_ids"][lo:hi][None], output_hidden_states=True).hidden_states
    aux = torch.cat([want[i + 1][0] for i in index["aux_layer_ids"]], -1)
    assert (shard["aux_hidden_states"][lo:hi] - aux).abs().max() < 1e-4
    assert train(mistral, prepared, tmp_path / "run", "max_steps=1", "save_every=1") == 0


def test_eval_data_is_evaluated_on_and_every_row_of_data_trained(tiny_target, prepared, tmp_path, capsys):
    """eval_data (SpecForge's eval-data-path): its first eval_samples rows are the engine's evaluation, and no row
    of data is held back; a folder prepared for another target is refused, naming both."""
    import shutil

    out = tmp_path / "run"
    assert train(tiny_target, prepared, out, "max_steps=1", f"eval_data={prepared}") == 0
    assert "data: 24 training rows of" in capsys.readouterr().out
    evals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if "eval_engine_tau" in line]
    assert evals and evals[-1]["eval_engine_tau"] >= 1
    other = tmp_path / "other"
    shutil.copytree(prepared, other)
    meta = json.loads((other / "toolkit_prepare.json").read_text())
    (other / "toolkit_prepare.json").write_text(json.dumps({**meta, "target": "org/another",
                                                            "target_fingerprint": "0" * 16}))
    assert train(tiny_target, prepared, tmp_path / "x", "max_steps=1", f"eval_data={other}") == 2
    assert "was prepared for org/another and data" in capsys.readouterr().err
    assert train(tiny_target, prepared, tmp_path / "x", "max_steps=1", f"eval_data={tmp_path / 'nope'}") == 2
    assert f"eval_data {tmp_path / 'nope'}: no such folder" in capsys.readouterr().err  # it said `data ...`


def test_a_run_stopped_inside_a_longer_schedule_resumes_into_it_unchanged(tiny_target, prepared, tmp_path, capsys):
    """schedule_steps (SpecForge's total-steps): 2 steps of a 4-step cosine, resumed to 4, train at the lrs of an
    uninterrupted 4-step run (without it the resume re-stretched the cosine, its lr jumping back up)."""
    def lrs(out):
        return [r["lr"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r]

    whole, part = tmp_path / "whole", tmp_path / "part"
    assert train(tiny_target, prepared, whole, "max_steps=4", "save_every=2") == 0
    assert train(tiny_target, prepared, part, "max_steps=2", "schedule_steps=4", "save_every=2") == 0
    assert lrs(part) == pytest.approx(lrs(whole)[:2])
    assert train(tiny_target, prepared, part, "max_steps=4", "schedule_steps=4", "save_every=2",
                 flags=["--resume"]) == 0
    got = {r["step"]: r["lr"] for r in map(json.loads, (part / "metrics.jsonl").read_text().splitlines())
           if "loss" in r}
    assert [got[s] for s in (1, 2, 3, 4)] == pytest.approx(lrs(whole)) and lrs(whole)[1] > lrs(whole)[3] > 0
    # shorter than the run: past its end transformers' cosine climbs back up
    assert train(tiny_target, prepared, tmp_path / "short", "max_steps=4", "schedule_steps=2") == 2
    assert "schedule_steps 2 is shorter than the run's 4 steps" in capsys.readouterr().err
    # a run from before eval_data (its train_config.json lacks the key) resumed with one: other training rows
    saved = json.loads((whole / "train_config.json").read_text())
    del saved["eval_data"]
    (whole / "train_config.json").write_text(json.dumps(saved))
    assert train(tiny_target, prepared, whole, "max_steps=5", f"eval_data={prepared}", flags=["--resume"]) == 2
    assert "eval_data was None, now" in capsys.readouterr().err
