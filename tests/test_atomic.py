"""toolkit.atomic: a file is whole or absent, and has the mode a plain open() gives, whoever writes it."""
import os

import pytest
import torch
from safetensors.torch import save_file

from toolkit.atomic import atomic_path, write_text


def test_files_get_the_umask_mode_even_when_the_writer_replaces_the_temp_file(tmp_path):
    """safetensors' save_file left its files 0600 (mkstemp's mode) while every other output was 0644."""
    umask = os.umask(0o022)
    try:
        with atomic_path(tmp_path / "w.safetensors") as tmp:
            save_file({"x": torch.zeros(2)}, str(tmp))
        write_text(tmp_path / "a.txt", "a")
    finally:
        os.umask(umask)
    for name in ("w.safetensors", "a.txt"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o644, name


def test_a_failed_write_leaves_neither_the_file_nor_its_temp(tmp_path):
    with pytest.raises(RuntimeError):
        with atomic_path(tmp_path / "x.bin") as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("stopped")
    assert list(tmp_path.iterdir()) == []
