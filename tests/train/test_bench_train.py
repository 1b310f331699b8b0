"""benchmarks/bench_train.py runs end to end (tiny target) and reports online/offline throughput and memory."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_train_reports_online_and_offline(tiny_target, prepared, tmp_path):
    out = tmp_path / "r.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/bench_train.py"), "--data", str(prepared),
                           "--rows", "8", "--steps", "2", "--threads", "1", "--out", str(out),
                           f"model={tiny_target}", "max_len=96", "batch_size=2", "draft_vocab_size=2048"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(out.read_text())
    for mode in ("online", "offline"):
        assert r[mode]["tokens_per_second"] > 0 and r[mode]["peak_memory_gb"] > 0 and r[mode]["steps"] == 2
    assert abs(r["online"]["final_loss"] - r["offline"]["final_loss"]) < 0.05 * r["online"]["final_loss"]
    assert r["dump_hidden_states"]["tokens"] > 0


def test_sim_vs_engine_reports_both_taus(tiny_target, prepared, tmp_path, shared):
    from toolkit.cli import main

    run = tmp_path / "run"
    assert main(["train", "--model", str(tiny_target), "--data", str(prepared), "--output-dir", str(run),
                 "max_steps=2", "batch_size=2", "max_len=96", "eval_samples=1", "eval_max_new_tokens=2",
                 "threads=1", "mixed_precision=no"]) == 0
    out = tmp_path / "s.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/sim_vs_engine.py"), "--draft", str(run / "draft"),
                           "--prompts", str(shared / "data/eval/mt_bench.jsonl"), "--limit", "1", "--steps", "3",
                           "--max-new-tokens", "8", "--threads", "1", "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["turns"] == 2 and r["engine_tau"] >= 1 and r["simulated_tau"] >= 1 and len(r["acc_i"]) == 3
    assert r["replay_differing_turns"] == 0 and r["replayed_tau"] == r["engine_tau"]
    png = tmp_path / "curves.png"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/plot_train.py"), str(run / "metrics.jsonl"),
                           "--out", str(png)], capture_output=True, text=True)
    assert done.returncode == 0 and png.read_bytes()[:4] == b"\x89PNG", done.stderr[-2000:]
