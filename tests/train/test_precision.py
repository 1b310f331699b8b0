"""`mixed_precision: auto` on a GPU: a launch's half precision is kept; a launch that named none (accelerate exports
"no", as every ZeRO launch does) trains the head in bf16 where the card has it, as the target runs there; an
explicit recipe value always wins."""
import pytest

from toolkit.train.precision import gpu_training_precision


@pytest.mark.parametrize("requested, launched, bf16, want", [
    ("auto", None, True, "bf16"), ("auto", "no", True, "bf16"), ("auto", "no", False, "no"),
    ("auto", "fp16", True, "fp16"), ("auto", "bf16", False, "bf16"),
    ("no", "bf16", True, "no"), ("fp16", None, True, "fp16"), ("bf16", "no", False, "bf16"),
])
def test_auto_on_a_gpu(requested, launched, bf16, want):
    assert gpu_training_precision(requested, launched, bf16) == want
