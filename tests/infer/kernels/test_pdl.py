"""When the kernels use programmatic dependent launch (toolkit/infer/kernels/pdl.py): TOOLKIT_PDL's three modes,
never on CPU, under the interpreter or before sm_90, and "auto" following the device's measured entry. That the
kernels compile with it and wait before touching shared data is tests/infer/kernels/test_aot.py's check; that
their outputs stay exact on a GPU is benchmarks/gpu/lease.sh's (the kernel tests rerun with TOOLKIT_PDL=on)."""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():  # as the other kernel tests, before the kernel modules are imported
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from toolkit.infer.kernels import gemv, pdl  # noqa: E402

CUDA = torch.device("cuda", 0)


@pytest.fixture
def compiled(monkeypatch):
    """A process that compiles (no interpreter) on a device of compute capability 9.0 named "H-test"."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(pdl, "_capability", lambda device: (9, 0))
    monkeypatch.setattr(gemv, "_device_name", lambda device: "H-test")
    monkeypatch.setattr(gemv, "tuned_configs", lambda name: {"H-test": {"pdl": True}}.get(name, {}))


def test_modes_on_a_device_that_supports_it(compiled, monkeypatch):
    for mode, want in (("on", True), ("off", False), ("auto", True)):
        monkeypatch.setenv("TOOLKIT_PDL", mode)
        assert pdl.enabled(CUDA) is want, mode
    assert pdl.launch_kw(CUDA) == {"PDL": True, "launch_pdl": True}
    monkeypatch.delenv("TOOLKIT_PDL")
    assert pdl.enabled(CUDA)  # auto is the default


def test_auto_follows_the_devices_measured_entry(compiled, monkeypatch):
    monkeypatch.setenv("TOOLKIT_PDL", "auto")
    monkeypatch.setattr(gemv, "_device_name", lambda device: "a device nobody measured")
    assert not pdl.enabled(CUDA)
    assert pdl.launch_kw(CUDA) == {"PDL": False}


def test_never_where_it_cannot_run(compiled, monkeypatch):
    monkeypatch.setenv("TOOLKIT_PDL", "on")
    assert not pdl.enabled(torch.device("cpu"))
    assert not pdl.enabled(torch.device("meta"))
    monkeypatch.setattr(pdl, "_capability", lambda device: (8, 0))  # an A100: no griddepcontrol
    assert not pdl.enabled(CUDA)
    monkeypatch.setattr(pdl, "_capability", lambda device: (9, 0))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not pdl.enabled(CUDA)


def test_a_bad_mode_is_refused_with_the_accepted_ones(compiled, monkeypatch):
    monkeypatch.setenv("TOOLKIT_PDL", "yes")
    with pytest.raises(ValueError, match="TOOLKIT_PDL='yes'; accepted: auto, on, off"):
        pdl.enabled(CUDA)
