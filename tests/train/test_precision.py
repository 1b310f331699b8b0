"""Training precisions on a GPU. `mixed_precision: auto`: a launch's half precision is kept; a launch that named
none (accelerate exports "no", as every ZeRO launch does) trains the head in bf16 on a card with a bf16 matrix unit
(sm_80+) and in fp16 before it (V100, T4), where torch.cuda.is_bf16_supported() also says True (emulated); bf16
asked for there is refused, naming the card. The frozen target's `dtype: auto` is the same half precision."""
import pytest
import torch

from toolkit.gpu_half import half_dtype, has_bf16
from toolkit.train.precision import gpu_training_precision, target_dtype

T4, H100 = ((7, 5), "Tesla T4"), ((9, 0), "NVIDIA H100 80GB HBM3")


@pytest.fixture
def gpu(monkeypatch):
    """Patch what torch.cuda says of the card: gpu((7, 5), "Tesla T4")."""
    def card(capability, name):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)  # as torch says on a T4 too
    return card


@pytest.mark.parametrize("requested, launched, bf16, want", [
    ("auto", None, True, "bf16"), ("auto", "no", True, "bf16"), ("auto", "no", False, "fp16"),
    ("auto", None, False, "fp16"), ("auto", "fp16", True, "fp16"), ("auto", "fp16", False, "fp16"),
    ("auto", "bf16", True, "bf16"), ("no", "bf16", True, "no"), ("no", None, False, "no"),
    ("fp16", None, True, "fp16"), ("fp16", "bf16", False, "fp16"), ("bf16", "no", True, "bf16"),
])
def test_auto_on_a_gpu(requested, launched, bf16, want):
    assert gpu_training_precision(requested, launched, bf16) == want


@pytest.mark.parametrize("requested, launched, setting", [
    ("bf16", None, "mixed_precision bf16"), ("bf16", "fp16", "mixed_precision bf16"),
    ("auto", "bf16", "accelerate launch --mixed_precision bf16"),
])
def test_bf16_asked_for_on_a_gpu_without_it_is_refused_by_name(gpu, requested, launched, setting):
    gpu(*T4)
    with pytest.raises(ValueError, match=rf"^{setting} needs a GPU of compute capability 8.0 or later .* this Tesla T4 "
                                         r"\(sm_75\) has no bf16 matrix unit: give mixed_precision fp16 \(auto picks"):
        gpu_training_precision(requested, launched, has_bf16())


@pytest.mark.parametrize("capability, bf16", [((7, 0), False), ((7, 5), False), ((8, 0), True), ((8, 6), True),
                                              ((8, 9), True), ((9, 0), True), ((12, 0), True)])
def test_the_half_precision_follows_the_capability_not_is_bf16_supported(gpu, capability, bf16):
    gpu(capability, "a card")
    assert has_bf16() == bf16
    assert half_dtype() == (torch.bfloat16 if bf16 else torch.float16)


def test_the_frozen_target_runs_in_the_gpu_half_precision(gpu, capsys):
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    gpu(*H100)
    assert target_dtype("auto", cuda, "bf16") == torch.bfloat16
    assert target_dtype("float16", cuda, "fp16") == torch.float16
    assert target_dtype("bfloat16", cuda, "no") == torch.bfloat16
    assert capsys.readouterr().err == ""
    gpu(*T4)
    assert target_dtype("auto", cuda, "fp16") == torch.float16
    assert "Tesla T4 (sm_75) has no bf16 matrix unit; the target runs in float16" in capsys.readouterr().err
    assert target_dtype("auto", cuda, "no") == torch.float16  # the hidden-state dump's rule
    assert target_dtype("float32", cuda, "fp16") == torch.float32
    with pytest.raises(ValueError, match=r"^dtype bfloat16 needs .* Tesla T4 \(sm_75\) .*: give dtype float16"):
        target_dtype("bfloat16", cuda, "fp16")
    # a CPU: bf16 under bf16 autocast (its matmuls ~2x fp32 where native), else fp32; an explicit dtype kept
    assert target_dtype("auto", cpu, "bf16") == torch.bfloat16 and target_dtype("auto", cpu, "no") == torch.float32
    assert target_dtype("bfloat16", cpu, "no") == torch.bfloat16


def test_the_trainer_asks_accelerate_for_fp16_on_a_t4(gpu, monkeypatch):
    """make_accelerator on a (patched) T4: auto gives Accelerator(mixed_precision="fp16"), which scales the loss;
    bf16 in the recipe is refused before accelerate is asked for anything."""
    import accelerate

    from toolkit.train.config import TrainConfig
    from toolkit.train.launch import make_accelerator

    asked = []

    class Recorder:
        def __init__(self, **kwargs):
            asked.append(kwargs.get("mixed_precision"))
            self.state = type("State", (), {"deepspeed_plugin": None})()

    gpu(*T4)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(accelerate, "Accelerator", Recorder)
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")  # what `accelerate launch` exports given nothing
    make_accelerator(TrainConfig(data="unused"))
    assert asked == ["fp16"]
    with pytest.raises(ValueError, match=r"^mixed_precision bf16 needs .* Tesla T4"):
        make_accelerator(TrainConfig(data="unused", mixed_precision="bf16"))
    gpu(*H100)
    make_accelerator(TrainConfig(data="unused"))
    assert asked == ["fp16", "bf16"]
