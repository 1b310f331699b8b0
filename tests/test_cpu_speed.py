"""Training precision on a CPU follows its GEMM rates: bf16 autocast where bf16 is native (clearly faster than
fp32), fp32 where it is emulated (20-60x slower), an explicit half precision kept but warned about."""
import torch

from toolkit.cpu_speed import cpu_training_precision, measure_gflops, quick_gflops

NATIVE = {"float32": 100.0, "bfloat16": 220.0, "float16": 180.0}  # AVX512-BF16 / AMX: ~2.2x
EMULATED = {"float32": 24.0, "bfloat16": 0.8, "float16": 1.5}     # an AVX2-only EPYC, 2026-11-26


def rates(table, calls=None):
    def measure(threads, dtype="float32"):
        if calls is not None:
            calls.append(dtype)
        return table[dtype]
    return measure


def test_auto_takes_bf16_only_where_it_is_native():
    chosen, note = cpu_training_precision("auto", None, 2, rates(NATIVE))
    assert chosen == "bf16" and "2.20x fp32" in note and "bf16 (target too)" in note
    chosen, note = cpu_training_precision("auto", "no", 2, rates(EMULATED))  # accelerate launch exports "no"
    assert chosen == "no" and "0.03x fp32" in note and "trains in fp32" in note
    assert cpu_training_precision("auto", None, 2, rates({"float32": 100.0, "bfloat16": 140.0}))[0] == "no"


def test_an_explicit_half_precision_is_kept_and_warned_about_where_it_is_emulated():
    chosen, note = cpu_training_precision("bf16", None, 2, rates(EMULATED))
    assert chosen == "bf16" and note.startswith("WARNING") and "0.8 GFLOP/s against 24.0" in note
    assert "30x slower" in note and "mixed_precision=no" in note
    assert cpu_training_precision("fp16", None, 2, rates(EMULATED))[1].count("fp16 GEMM runs 1.5") == 1
    assert cpu_training_precision("bf16", None, 2, rates(NATIVE)) == ("bf16", None)
    # a launch's bf16 under auto is an explicit choice too
    assert cpu_training_precision("auto", "bf16", 2, rates(EMULATED))[1].startswith("WARNING")


def test_no_measures_nothing():
    calls = []
    assert cpu_training_precision("no", "bf16", 2, rates(EMULATED, calls)) == ("no", None) and calls == []


def test_the_trainer_takes_fp32_on_a_cpu_that_emulates_bf16(monkeypatch, capsys):
    """make_accelerator under mixed_precision auto, this CPU measured as emulating bf16: fp32, and it says so."""
    from toolkit.train.config import TrainConfig
    from toolkit.train.launch import make_accelerator

    monkeypatch.setattr("toolkit.cpu_speed.quick_gflops", rates(EMULATED))
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    acc = make_accelerator(TrainConfig(data="unused", threads=1))
    assert acc.mixed_precision == "no"
    assert "bf16 GEMM 0.8 GFLOP/s = 0.03x fp32 (24.0), so the head trains in fp32" in capsys.readouterr().out


def test_serving_in_an_emulated_half_precision_on_a_cpu_is_warned_about(monkeypatch, capsys):
    """`toolkit bench / serve --dtype bfloat16 --device cpu`: kept, with both rates on stderr where emulated."""
    from toolkit.infer.loading import pick_device

    calls = []
    monkeypatch.setattr("toolkit.cpu_speed.quick_gflops", rates(EMULATED, calls))
    assert pick_device("cpu", "bfloat16") == ("cpu", torch.bfloat16)
    err = capsys.readouterr().err
    assert err.startswith("WARNING --dtype bfloat16 on this CPU: its bf16 GEMM runs 0.8 GFLOP/s against 24.0")
    assert "--dtype auto serves in fp32 on a CPU" in err
    calls.clear()
    assert pick_device("cpu", "auto") == ("cpu", torch.float32) and pick_device("cpu", "float32")[1] == torch.float32
    assert calls == []  # fp32 measures nothing
    monkeypatch.setattr("toolkit.cpu_speed.quick_gflops", rates(NATIVE))
    assert pick_device("cpu", "float16") == ("cpu", torch.float16) and capsys.readouterr().err == ""


def test_the_quick_measure_is_real_and_made_once():
    quick_gflops.cache_clear()
    first = quick_gflops(1)
    assert first > 0.5 and quick_gflops(1) == first and quick_gflops.cache_info().hits == 1
    assert measure_gflops(threads=1, reps=1, rows=64) > 0.1
