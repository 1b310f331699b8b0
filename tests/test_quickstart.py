"""`toolkit quickstart` end to end on the embedded SmolLM2 with a small budget: every artifact is written, the
trained head is accepted (τ > 1) with greedy text identical to plain decoding, and a rerun skips every stage."""
import json
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_quickstart_runs_the_whole_pipeline_and_resumes(tmp_path, smollm2_dir):
    out = tmp_path / "qs"
    cmd = [sys.executable, "-m", "toolkit.cli", "quickstart", "--out", str(out), "--minutes", "3", "--device", "cpu"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    for f in ("report.md", "training.png", "speedup.png", "bench.png", "maps/coverage.png", "draft/model.safetensors",
              "draft/config.json", "prompts.jsonl", "eval_prompts.jsonl", "regen.jsonl", "quickstart.json"):
        assert (out / f).is_file(), f
    bench = json.loads((out / "bench.json").read_text())
    assert bench["speculative"]["tau"] > 1.0
    assert bench["greedy_identical_to_baseline"] is True
    report = (out / "report.md").read_text()
    assert f"{bench['speculative']['tau']:.2f}" in report and "![training curves](training.png)" in report
    assert f"toolkit serve --draft {out / 'draft'}" in done.stdout

    again = subprocess.run(cmd, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("skipped") == 7 and "$ toolkit" not in again.stdout
