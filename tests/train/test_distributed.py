"""The trainer under real launchers on CPU: DDP over 2 gloo ranks, DeepSpeed ZeRO-2 and ZeRO-3 (the shipped
accelerate files on 2 ranks, DS_ACCELERATOR=cpu). All three see the same batches and must log the same losses and
export loadable drafts. 6 steps of 2 x 2 rows cross the first epoch's end (22 training rows, 11 micro-batches)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from toolkit.train.tracking import read_metrics

ROOT = Path(__file__).resolve().parents[2]
LAUNCHES = {
    # without ACCELERATE_USE_CPU=1 accelerate set up no DDP on a machine without CUDA: each rank trained its own copy
    "ddp": (["--config_file", "recipes/accelerate/cpu_2ranks.yaml"], {}),
    # the README's command; their mixed_precision: bf16 made accelerate refuse to start beside a DeepSpeed JSON
    "zero2": (["--config_file", "recipes/accelerate/zero2.yaml", "--num_processes", "2"], {"DS_ACCELERATOR": "cpu"}),
    "zero3": (["--config_file", "recipes/accelerate/zero3.yaml", "--num_processes", "2"], {"DS_ACCELERATOR": "cpu"}),
}
# Loaded by every Python process the DDP launch starts: records which ranks read the data to count the draft
# vocabulary (each did; the main process alone does, and sends the result).
COUNT_HOOK = """
import os
if os.environ.get("RANK") is not None:
    from toolkit.train import data

    def counted(self, *args, _read=data.PreparedData.assistant_tokens, **kwargs):
        with open(os.environ["VOCAB_COUNTED_BY"], "a") as fh:
            fh.write(os.environ["RANK"] + "\\n")
        return _read(self, *args, **kwargs)

    data.PreparedData.assistant_tokens = counted
"""


RUN = ["max_steps=6", "batch_size=2", "max_len=96", "log_every=1", "save_every=2", "eval_samples=2",
       "eval_max_new_tokens=4", "threads=1", "lr=3e-3", "mixed_precision=no"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tiny_target, prepared, tmp_path_factory):
    out = {}
    for name, (flags, env) in LAUNCHES.items():
        folder = tmp_path_factory.mktemp(name)
        if name == "ddp":
            (folder / "hook").mkdir()
            (folder / "hook/sitecustomize.py").write_text(COUNT_HOOK)
            path = os.pathsep.join([str(folder / "hook"), str(ROOT), os.environ.get("PYTHONPATH", "")])
            env = {**env, "PYTHONPATH": path, "VOCAB_COUNTED_BY": str(folder / "counted_by")}
        cmd = ["accelerate", "launch", *flags, "--main_process_port", str(free_port()), "toolkit/train/eagle3.py",
               "--model", str(tiny_target), "--data", str(prepared), "--output-dir", str(folder / "run"), *RUN]
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
    assert [r["step"] for r in recs] == [1, 2, 3, 4, 5, 6]
    assert len([r for r in read_metrics(run / "metrics.jsonl") if "eval_engine_tau" in r]) == 1  # rank 0 alone
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
                 *RUN, "grad_accum=2"]) == 0
    one, ddp = ([r for r in read_metrics(p / "metrics.jsonl") if "loss" in r] for p in (tmp_path / "one", runs["ddp"]))
    # step 6 holds epoch 0's last micro-batch and epoch 1's first: dealt per epoch, rank 1 took epoch 1's second
    assert [r["tokens"] for r in one] == [r["tokens"] for r in ddp] and len(one) == 6
    assert [r["lr"] for r in one] == [r["lr"] for r in ddp] and [r["epoch"] for r in one] == [r["epoch"] for r in ddp]
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
    from toolkit.infer.draft_folder import load_draft
    from toolkit.infer.loading import load_target

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
    # the checkpoint leaves the target's frozen lm_head and embedding out: neither in the module's state nor as
    # DeepSpeed's frozen-parameter fragments (written beside it unless told not to)
    for f in (tmp_path / "run/checkpoint-2").rglob("*model_states.pt"):
        saved = torch.load(f, map_location="cpu", weights_only=False)
        assert saved.get("frozen_param_fragments") is None, f
        assert not [k for k in saved["module"] if k.endswith(("lm_head.weight", "embed.weight"))], f


def test_only_the_main_process_reads_the_data_to_count_the_draft_vocabulary(runs):
    assert (runs["ddp"].parent / "counted_by").read_text() == "0\n"
    # the ranks trained one head: rank 1 took the vocabulary rank 0 counted (all three launches pick the same)
    from safetensors.torch import load_file

    d2t = {n: load_file(p / "draft/model.safetensors")["d2t"] for n, p in runs.items()}
    assert all(torch.equal(d2t["ddp"], v) for v in d2t.values())


def test_zero3_resumes_with_the_uninterrupted_losses_and_refuses_another_launch(runs, tiny_target, prepared, tmp_path):
    """Resumed at step 4 of the ZeRO-3 run (steps 5 and 6 cross into epoch 1 again), the losses and the exported
    head are bit-equal; resumed by one process without DeepSpeed it is refused by name, where accelerate failed on
    a missing pytorch_model.bin (a 2 -> 1 ZeRO-3 resume: a tensor size; ZeRO-2 -> ZeRO-3: an AssertionError)."""
    import shutil

    from safetensors.torch import load_file

    whole = runs["zero3"]
    cut = tmp_path / "run"
    shutil.copytree(whole, cut)
    shutil.rmtree(cut / "checkpoint-6")
    shutil.rmtree(cut / "draft")
    (cut / "latest").write_text("checkpoint-4\n")
    args = ["--model", str(tiny_target), "--data", str(prepared), "--output-dir", str(cut), *RUN, "--resume"]
    one = subprocess.run([sys.executable, "toolkit/train/eagle3.py", *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert one.returncode == 2 and ("written by 2 process(es) under DeepSpeed ZeRO-3 in fp32, this launch runs 1 "
                                    "process(es) without DeepSpeed") in one.stderr, one.stderr[-3000:]
    flags, env = LAUNCHES["zero3"]
    cmd = ["accelerate", "launch", *flags, "--main_process_port", str(free_port()), "toolkit/train/eagle3.py", *args]
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed from" in proc.stdout and "at step 4" in proc.stdout
    a, b = ({r["step"]: r["loss"] for r in read_metrics(p / "metrics.jsonl") if "loss" in r} for p in (whole, cut))
    assert a == b
    wa, wb = (load_file(p / "draft/model.safetensors") for p in (whole, cut))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
