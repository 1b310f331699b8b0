"""toolkit/cli.py: what the system refuses (an OSError) is one line naming the path, like every other error."""
import pytest

from toolkit.cli import main


def test_an_oserror_is_one_line_not_a_traceback(tmp_path, capsys, monkeypatch):
    """A path the system refuses (permission, full disk, a file where a folder must be) once ended in a
    traceback: only FileNotFoundError of the OSErrors was reported as `toolkit <command>: error: ...`."""
    from toolkit import models

    def refuse(args):
        raise PermissionError(13, "Permission denied", str(tmp_path / "cache"))

    monkeypatch.setattr(models, "models_main", refuse)
    assert main(["models"]) == 2
    err = capsys.readouterr().err
    assert err == f"toolkit models: error: [Errno 13] Permission denied: '{tmp_path / 'cache'}'\n"
    monkeypatch.setenv("TOOLKIT_DEBUG", "1")
    with pytest.raises(PermissionError):
        main(["models"])
