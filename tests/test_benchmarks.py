"""The GPU benchmark script is ready: it runs end to end on CPU with a tiny config and reports every figure."""
import json
import subprocess
import sys

import pytest
from conftest import ROOT


@pytest.mark.parametrize("graphs", [[], ["--cuda-graphs"]], ids=["eager", "graphs"])
def test_bench_gpu_runs_on_cpu_with_a_tiny_config(graphs):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/bench_gpu.py"), "--config", "tiny", "--device",
                           "cpu", "--dtype", "float32", "--iters", "2", "--context", "256", *graphs],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    r = json.loads(done.stdout)
    assert r["cuda_graphs"] == bool(graphs)
    assert r["decode_ms"] > 0 and 0 < r["decode_vs_roofline"]
    assert set(r["verify_ms"]) == {"2", "4", "8", "16", "32", "64"}
    assert r["draft_step_ms"] > 0 and len(r["predicted_bs1_speedup"]) == 6
    assert r["draft_loop_tree60_ms"] > r["draft_step_ms"]


def test_bench_table_lists_runs_and_sweeps_with_ratios(tmp_path):
    def report(tau, sweep=()):
        return {"head": "MTPHead", "draft_vocab_size": 49152,
                "tree": {"num_steps": 3, "topk": 1, "num_draft_tokens": 4},
                "speculative": {"tau": tau, "tokens_per_second": 20.0, "accept_rate_by_position": [0.5, 0.25]},
                "baseline": {"tokens_per_second": 10.0}, "sweep": list(sweep)}

    (tmp_path / "ref.json").write_text(json.dumps(report(1.5)))
    (tmp_path / "mtp.json").write_text(json.dumps(report(2.25, [{"num_steps": 1, "topk": 1, "num_draft_tokens": 2,
                                                                 "tau": 1.5, "tokens_per_second": 15.0}])))
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/bench_table.py"), str(tmp_path / "mtp.json"),
                           "--reference", str(tmp_path / "ref.json")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 4
    assert "| mtp | MTPHead | 49152 | 3 steps, topk 1, 4 tokens | 2.25 | 20.0 | 2.00x | 0.50, 0.25 | 1.50 |" == lines[2]
    assert "1 steps, topk 1, 2 tokens | 1.50 | 15.0 | 1.50x |  | 1.00 |" in lines[3]
