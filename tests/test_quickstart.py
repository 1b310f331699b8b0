"""`toolkit quickstart` end to end on the embedded SmolLM2 with a small budget: every artifact is written, the
trained head is accepted (τ > 1) with greedy text identical to plain decoding, and a rerun skips every stage.
The plan's sizes follow the machine's measured speed, so --minutes holds on slow and fast boxes."""
import argparse
import json
import subprocess
import sys

import pytest
import torch

from toolkit.quickstart import add_args
from toolkit.quickstart_plan import (REFERENCE_GFLOPS, Plan, measure_gflops, pick_precision,
                                     pick_speed)


def test_plan_shrinks_on_a_slower_machine_and_ignores_cpu_speed_on_a_gpu():
    ref, slow = Plan.for_budget(20, gpu=False, speed=1.0), Plan.for_budget(20, gpu=False, speed=0.25)
    assert (ref.prompts, ref.eval_prompts) == (210, 4)  # RESULTS.md's 20-minute runs (7 before the lookup run)
    assert slow.prompts == 52 and slow.eval_prompts == 2 and slow.train_seconds == ref.train_seconds
    # a faster GEMM answers and trains more, but the one-thread bench does not decode faster: same prompts
    assert Plan.for_budget(20, gpu=False, speed=1.4).eval_prompts == ref.eval_prompts
    assert slow.train_steps(170.0) * 4 == pytest.approx(ref.train_steps(170.0), abs=4)
    assert Plan.for_budget(3, gpu=False, speed=0.01).prompts == 16  # floors keep every stage meaningful
    assert Plan.for_budget(20, gpu=True, speed=0.25) == Plan.for_budget(20, gpu=True, speed=3.0)
    # a GPU answers and trains ~25x faster, but transformers' generate in the bench is launch-bound there
    assert Plan.for_budget(5, gpu=True).eval_prompts == 3 and Plan.for_budget(20, gpu=True).eval_prompts == 15
    with pytest.raises(ValueError, match="at least 2 minutes"):
        Plan.for_budget(1, gpu=False)


def test_pick_speed_measures_once_then_keeps_the_resumed_plan(monkeypatch):
    state = {"stages": {}}
    assert pick_speed("auto", 20, state, gpu=True) == 25.0 and state == {"stages": {}}
    assert pick_speed(0.5, 20, state, gpu=False) == 0.5
    monkeypatch.setattr("toolkit.quickstart_plan.measure_gflops", lambda threads: REFERENCE_GFLOPS / 4)
    assert pick_speed("auto", 20, state, gpu=False) == 0.25 and state["gflops"] == REFERENCE_GFLOPS / 4
    state["plan"] = {"speed": 0.25}
    monkeypatch.setattr("toolkit.quickstart_plan.measure_gflops", lambda threads: 10 * REFERENCE_GFLOPS)
    assert pick_speed("auto", 20, dict(state, minutes=20), gpu=False) == 0.25  # resumed: same plan
    assert pick_speed("auto", 30, dict(state, minutes=20), gpu=False) == 4.0   # new budget: measured, capped


def test_measure_gflops_is_positive_and_restores_the_thread_count():
    before = torch.get_num_threads()
    assert measure_gflops(threads=1, reps=2) > 0.5 and measure_gflops(threads=1, reps=2, dtype="bfloat16") > 0.1
    assert torch.get_num_threads() == before


def test_measure_gflops_stops_on_its_clock(monkeypatch):
    """A CPU that emulates bf16 runs this GEMM at ~1 GFLOP/s: the measurement stops after `seconds`, not after
    its 50 products (80 s of the quickstart's 20 minutes on such a box)."""
    import toolkit.quickstart as qs

    calls = []

    def slow_clock():  # every product seems to take 0.4 s
        calls.append(None)
        return 0.2 * len(calls)

    monkeypatch.setattr(qs.time, "perf_counter", slow_clock)
    assert measure_gflops(threads=1, dtype="float32", seconds=1.0) > 0
    assert len(calls) <= 2 * 5  # two clock reads per product: at most ~5 products of the 50


def test_bf16_is_taken_only_where_its_gemm_is_clearly_faster_and_plans_more_steps(monkeypatch):
    rates = {"float32": 100.0, "bfloat16": 220.0}  # a CPU with native bf16 (AVX512-BF16): ~2.2x
    monkeypatch.setattr("toolkit.quickstart_plan.measure_gflops", lambda threads, dtype="float32": rates[dtype])
    state = {"stages": {}}
    assert pick_precision("auto", 20, state, gpu=False) == ("bf16", "bf16") and state["bf16_gflops"] == 220.0
    assert pick_precision("bf16", 20, {"stages": {}}, gpu=False) == ("bf16", "bf16")
    rates["bfloat16"] = 40.0  # emulated bf16 (AVX2 only) is slower than fp32
    assert pick_precision("auto", 20, {"stages": {}}, gpu=False) == ("no", "no")
    # forced bf16 on an emulating CPU: trains as told, but the target answers in fp32 (no time cap there)
    assert pick_precision("bf16", 20, {"stages": {}}, gpu=False) == ("bf16", "no")
    reused = {"stages": {}, "gflops": 20.0}  # the fp32 rate measured for the speed is reused
    assert pick_precision("auto", 20, reused, gpu=False) == ("bf16", "bf16")
    resumed = {"minutes": 20, "plan": {"precision": "bf16", "answer_precision": "bf16"}}
    assert pick_precision("auto", 20, resumed, gpu=False) == ("bf16", "bf16")  # its finished stages fit that plan
    assert pick_precision("auto", 20, {"minutes": 20, "plan": {"precision": "bf16"}}, gpu=False) == ("bf16", "bf16")
    assert pick_precision("no", 20, resumed, gpu=False) == ("no", "no")
    # resumed with the bf16 it was told: the run's answer precision, not a new timing now on the other side of the gain
    # (its prompts would change, and the resume be refused as another plan)
    forced_run = {"minutes": 20, "plan": {"precision": "bf16", "answer_precision": "no"}}
    rates["bfloat16"] = 220.0
    assert pick_precision("bf16", 20, forced_run, gpu=False) == ("bf16", "no")
    # a GPU: auto is the trainer's rule there (bf16 from sm_80, fp16 before); the engine answers in its default
    for capability, half in (((9, 0), "bf16"), ((7, 5), "fp16")):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "a GPU")
        assert pick_precision("auto", 20, {}, gpu=True) == (half, "no")
        assert pick_precision("no", 20, {}, gpu=True) == ("no", "no")
        assert Plan.for_budget(20, gpu=True, precision=half).answer_precision == ("no" if half == "fp16" else half)
    with pytest.raises(ValueError, match=r"^--mixed-precision bf16 needs .* \(sm_75\) has no bf16 matrix unit"):
        pick_precision("bf16", 20, {}, gpu=True)  # before prompts are answered, not at the training stage
    forced = Plan.for_budget(20, gpu=False, precision="bf16", answer_precision="no")
    assert forced.answer_dtype == "auto" and forced.prompts == Plan.for_budget(20, gpu=False).prompts
    fp32, bf16 = Plan.for_budget(20, gpu=False), Plan.for_budget(20, gpu=False, precision="bf16")
    assert fp32.train_seconds == bf16.train_seconds and (fp32.answer_dtype, bf16.answer_dtype) == ("auto", "bfloat16")
    assert bf16.prompts == int(1.5 * fp32.prompts)  # the target answers in bf16 too, ~1.5x as fast
    assert bf16.train_steps(170.0) == pytest.approx(1.5 * fp32.train_steps(170.0), abs=1)
    with pytest.raises(ValueError, match="precision 'fp32': accepted no, bf16, fp16"):
        Plan.for_budget(20, gpu=False, precision="fp32")
    with pytest.raises(ValueError, match="answer_precision 'fp16': accepted no, bf16"):
        Plan.for_budget(20, gpu=False, answer_precision="fp16")


@pytest.mark.parametrize("bad", ["0", "fast", "-1", "1000"])
def test_bad_speed_is_refused_with_what_is_accepted(bad, capsys):
    p = argparse.ArgumentParser()
    add_args(p)
    with pytest.raises(SystemExit):
        p.parse_args(["--speed", bad])
    assert "give auto or a relative speed in 0.01..100" in capsys.readouterr().err
    assert p.parse_args(["--speed", "0.3"]).speed == 0.3 and p.parse_args([]).speed == "auto"
    assert p.parse_args([]).mixed_precision == "auto" and p.parse_args(["--mixed-precision", "bf16"]).mixed_precision
    with pytest.raises(SystemExit):
        p.parse_args(["--mixed-precision", "fp16"])
    assert "invalid choice: 'fp16'" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("flags, message", [(["--minutes", "nan"], "--minutes nan: give a finite time budget"),
                                           (["--minutes", "inf"], "--minutes inf"), (["--out", "FILE"], "is a file")])
def test_a_budget_that_is_no_number_or_a_file_as_out_is_refused_before_anything_runs(tmp_path, capsys, flags,
                                                                                         message):
    """--minutes nan / inf planned stages of NaN / unbounded size and started the target answering prompts; --out
    naming a file failed with FileExistsError's traceback."""
    from toolkit.cli import main

    (tmp_path / "FILE").write_text("x")
    flags = [str(tmp_path / "FILE") if f == "FILE" else f for f in flags]
    args = ["quickstart", *flags] if "--out" in flags else ["quickstart", "--out", str(tmp_path / "q"), *flags]
    assert main(args) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "q").exists() and (tmp_path / "FILE").read_text() == "x"


def test_a_stage_interrupted_interrupts_the_run_and_its_commands_paste_as_they_ran(monkeypatch, capsys):
    """A stage's Ctrl-C (130) / SIGTERM (143) was reported as a failed stage with exit 2; a path with a space was
    printed unquoted."""
    import toolkit.cli
    from toolkit.cli import Terminated
    from toolkit.quickstart import _run

    for rc, kind in ((130, KeyboardInterrupt), (143, Terminated)):
        monkeypatch.setattr(toolkit.cli, "main", lambda argv, rc=rc: rc)
        with pytest.raises(kind):
            _run(["train", "--output-dir", "my run/train"])
    assert "$ toolkit train --output-dir 'my run/train'" in capsys.readouterr().out
    monkeypatch.setattr(toolkit.cli, "main", lambda argv: 2)
    with pytest.raises(RuntimeError, match="`toolkit train` failed"):
        _run(["train"])


def test_only_whole_lines_count_as_answers(tmp_path):
    from toolkit.quickstart import whole_lines

    path = tmp_path / "regen.jsonl"
    assert whole_lines(path) == 0
    path.write_text('{"a": 1}\n{"a": 2}\n{"a": ')  # killed mid-write
    assert whole_lines(path) == 2


def test_quickstart_runs_the_whole_pipeline_and_resumes(tmp_path, smollm2_dir):
    out = tmp_path / "q s"  # a space: every stage's paths, and the commands printed, quoted
    # --speed 1 and fp32 fix the plan (31 prompts, ~20 steps) so the head is the same on a slow or fast CI box
    cmd = [sys.executable, "-m", "toolkit.cli", "quickstart", "--out", str(out), "--minutes", "3", "--device", "cpu",
           "--speed", "1", "--mixed-precision", "no"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    for f in ("report.md", "training.png", "speedup.png", "bench.png", "maps/coverage.png", "draft/model.safetensors",
              "draft/config.json", "prompts.jsonl", "eval_prompts.jsonl", "regen.jsonl", "quickstart.json"):
        assert (out / f).is_file(), f
    bench = json.loads((out / "bench.json").read_text())
    assert bench["speculative"]["tau"] > 1.0
    assert bench["greedy_identical_to_baseline"] is True
    grafted = bench["sweep"][0]  # the head again with a prompt-lookup branch: same text, more tokens per forward
    assert (grafted["num_steps"], grafted["lookup"], grafted["greedy_identical_to_speculative"]) == (3, 10, True)
    ev = [json.loads(line) for line in (out / "train/metrics.jsonl").read_text().splitlines() if "eval_engine" in line][-1]
    assert ev["eval_replay_differing_rows"] == 0 and ev["eval_replayed_tau"] == ev["eval_engine_tau"] > 1.0
    report = (out / "report.md").read_text()
    assert f"{bench['speculative']['tau']:.2f}" in report and "![training curves](training.png)" in report
    assert f"tau is **{grafted['tau']:.2f}**" in report and "prompt-lookup branch: tau" in done.stdout
    assert "mixed_precision=no" in done.stdout and "optimizer steps\nat batch 4 in fp32" in report
    assert f"toolkit serve --draft {out / 'draft'}" in done.stdout

    assert f"$ toolkit build-token-map --data '{out / 'regen.jsonl'}'" in done.stdout

    again = subprocess.run(cmd, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("skipped") == 7 and "$ toolkit" not in again.stdout
    # a kill between the token map's files (coverage.json is its last) redoes that stage, numbered as the first run
    (out / "maps" / "coverage.json").unlink()
    again = subprocess.run(cmd, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "stage 4: token map" in again.stdout and again.stdout.count("$ toolkit") == 1
    # another budget would reuse outputs sized for this one and report the new plan: refused
    other = subprocess.run([c if c != "3" else "4" for c in cmd], capture_output=True, text=True)  # --minutes 4
    assert other.returncode == 2 and "holds a run planned for 3 minutes" in other.stderr, other.stderr[-2000:]
