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


def test_an_output_path_below_a_file_or_of_the_wrong_kind_is_refused_up_front(tmp_path):
    """`--out notes.txt/maps` failed with NotADirectoryError / FileExistsError only after the work was done."""
    from toolkit.atomic import check_out_path

    (tmp_path / "f").write_text("x")
    (tmp_path / "d").mkdir()
    with pytest.raises(ValueError, match=r"--out .*f/maps: .*f is a file, not a folder"):
        check_out_path("--out", tmp_path / "f" / "maps", folder=True)
    with pytest.raises(ValueError, match=r"--out .*f/deep/b\.json: .*f is a file"):
        check_out_path("--out", tmp_path / "f" / "deep" / "b.json", folder=False)
    with pytest.raises(ValueError, match=r"--out .*f is a file; give a folder"):
        check_out_path("--out", tmp_path / "f", folder=True)
    with pytest.raises(ValueError, match=r"--out .*d is a folder; give a file name"):
        check_out_path("--out", tmp_path / "d", folder=False)
    check_out_path("--out", tmp_path / "new" / "deeper", folder=True)  # folders that can be made: fine
    check_out_path("--out", tmp_path / "d" / "b.json", folder=False)
    assert not (tmp_path / "new").exists()


def test_an_output_place_nothing_can_be_written_in_is_refused_up_front(tmp_path, capsys):
    """`--out /proc/x` (or a read-only mount) failed with a bare '[Errno 2] No such file or directory' after the
    corpus was counted or the target loaded; a write is tried first (os.access says yes to root everywhere)."""
    from toolkit.atomic import check_out_path
    from toolkit.cli import main

    with pytest.raises(ValueError, match=r"--out /proc/toolkit-x: nothing can be written in /proc"):
        check_out_path("--out", "/proc/toolkit-x", folder=True)
    assert main(["build-token-map", "--data", str(tmp_path), "--out", "/proc/toolkit-x", "--sizes", "8"]) == 2
    assert "nothing can be written in /proc" in capsys.readouterr().err
    check_out_path("--out", tmp_path / "run", folder=True)
    assert [p.name for p in tmp_path.iterdir()] == []  # the check leaves nothing behind
