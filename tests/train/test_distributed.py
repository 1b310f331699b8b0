"""The trainer under real launchers on CPU: DDP over 2 gloo ranks, DeepSpeed ZeRO-2 and ZeRO-3 (2 ranks,
DS_ACCELERATOR=cpu). All three see the same batches and must log the same losses and export loadable drafts."""
from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest
import torch

from toolkit.train.tracking import read_metrics

ROOT = Path(__file__).resolve().parents[2]
LAUNCHES = {
    "ddp": (["--config_file", "recipes/accelerate/cpu_2ranks.yaml"], {"ACCELERATE_USE_CPU": "1"}),
    "zero2": (["--use_deepspeed", "--deepspeed_config_file", "recipes/deepspeed/zero2.json", "--num_processes", "2",
               "--num_machines", "1"], {"DS_ACCELERATOR": "cpu"}),
    "zero3": (["--use_deepspeed", "--deepspeed_config_file", "recipes/deepspeed/zero3.json", "--num_processes", "2",
               "--num_machines", "1"], {"DS_ACCELERATOR": "cpu"}),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tiny_target, prepared, tmp_path_factory):
    out = {}
    for name, (flags, env) in LAUNCHES.items():
        folder = tmp_path_factory.mktemp(name)
        cmd = ["accelerate", "launch", *flags, "--main_process_port", str(free_port()), "toolkit/train/eagle3.py",
               "--model", str(tiny_target), "--data", str(prepared), "--output-dir", str(folder / "run"),
               "max_steps=4", "batch_size=2", "max_len=96", "log_every=1", "save_every=2", "eval_samples=2",
               "eval_max_new_tokens=4", "threads=1", "lr=3e-3", "mixed_precision=no"]
        proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "2 process(es)" in proc.stdout, proc.stdout
        out[name] = folder / "run"
    return out


@pytest.mark.parametrize("name", list(LAUNCHES))
def test_launch_trains_two_ranks_and_exports(runs, name, tiny_target):
    from toolkit.infer.config import ModelConfig
    from toolkit.infer.drafts import load_eagle3

    run = runs[name]
    recs = [r for r in read_metrics(run / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in recs] == [1, 2, 3, 4]
    load_eagle3(run / "draft", ModelConfig.from_folder(tiny_target))
    assert json.loads((run / "draft/config.json").read_text())["toolkit"]["target"] == str(tiny_target)


def test_ddp_and_zero_stages_agree(runs):
    loss = {n: [r["loss"] for r in read_metrics(p / "metrics.jsonl") if "loss" in r] for n, p in runs.items()}
    for name in ("zero2", "zero3"):
        assert all(abs(a - b) <= 1e-4 * abs(a) for a, b in zip(loss["ddp"], loss[name])), loss
    tokens = {n: [r for r in read_metrics(p / "metrics.jsonl") if "loss" in r][-1]["tokens"] for n, p in runs.items()}
    assert len(set(tokens.values())) == 1  # both ranks' tokens counted, the same batches everywhere


def test_two_ranks_log_what_one_process_accumulating_both_batches_logs(runs, tiny_target, prepared, tmp_path):
    """Rank r takes batches r, r + 2, ...; one process with grad_accum=2 takes them in pairs: the same rows and the
    same averaged gradient each step, so the logged loss (every rank's micro-batches, not rank 0's) must agree."""
    from toolkit.cli import main

    assert main(["train", "--model", str(tiny_target), "--data", str(prepared), "--output-dir", str(tmp_path / "one"),
                 "max_steps=4", "batch_size=2", "grad_accum=2", "max_len=96", "log_every=1", "save_every=4",
                 "eval_samples=2", "eval_max_new_tokens=4", "threads=1", "lr=3e-3", "mixed_precision=no"]) == 0
    one, ddp = ([r for r in read_metrics(p / "metrics.jsonl") if "loss" in r] for p in (tmp_path / "one", runs["ddp"]))
    assert [r["tokens"] for r in one] == [r["tokens"] for r in ddp]
    for a, b in zip(one, ddp):
        assert abs(a["loss"] - b["loss"]) <= 1e-4 * abs(a["loss"]), (one, ddp)
        assert all(abs(x - y) <= 1e-4 * abs(x) for x, y in zip(a["loss_i"], b["loss_i"]))
    # each step's loss divides by the assistant tokens of all four micro-batches, summed over the ranks: without
    # that all-reduce a rank would divide by its own and the two runs would train different weights
    from safetensors.torch import load_file

    w_one, w_ddp = (load_file(p / "draft/model.safetensors") for p in (tmp_path / "one", runs["ddp"]))
    assert w_one.keys() == w_ddp.keys()
    for k in w_one:
        assert torch.allclose(w_one[k].float(), w_ddp[k].float(), rtol=1e-4, atol=1e-5), k


def test_mtp_trains_under_zero3_with_its_frozen_lm_head_and_exports(tiny_target, prepared, tmp_path):
    """The same launcher runs the MTP entry script; its module holds the target's frozen lm_head, which
    ZeRO-3 partitions and gathers for the export like any other weight."""
    from toolkit.infer.loading import load_draft, load_target

    flags, env = LAUNCHES["zero3"]
    cmd = ["accelerate", "launch", *flags, "--main_process_port", str(free_port()), "toolkit/train/mtp.py",
           "--model", str(tiny_target), "--data", str(prepared), "--output-dir", str(tmp_path / "run"),
           "max_steps=2", "batch_size=2", "max_len=96", "log_every=1", "save_every=2", "eval_samples=2",
           "eval_max_new_tokens=4", "threads=1", "lr=3e-3", "ttt_steps=2", "mixed_precision=no"]
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 process(es)" in proc.stdout
    assert [r["step"] for r in read_metrics(tmp_path / "run/metrics.jsonl") if "loss" in r] == [1, 2]
    head = load_draft(str(tmp_path / "run/draft"), load_target(tiny_target), None)
    assert type(head).__name__ == "MTPHead"
