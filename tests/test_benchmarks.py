"""The GPU benchmark script is ready: it runs end to end on CPU with a tiny config and reports every figure."""
import json
import subprocess
import sys

from conftest import ROOT


def test_bench_gpu_runs_on_cpu_with_a_tiny_config():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/bench_gpu.py"), "--config", "tiny", "--device",
                           "cpu", "--dtype", "float32", "--iters", "2", "--context", "256"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    r = json.loads(done.stdout)
    assert r["decode_ms"] > 0 and 0 < r["decode_vs_roofline"]
    assert set(r["verify_ms"]) == {"2", "4", "8", "16", "32", "64"}
    assert r["draft_step_ms"] > 0 and len(r["predicted_bs1_speedup"]) == 6
