"""Checkpoint folders are replaced whole: a kill between steps never leaves a half-deleted folder."""
from pathlib import Path

import pytest

from toolkit.train.checkpoint import latest, publish_draft, replace_dir


def folder(path: Path, text: str) -> Path:
    path.mkdir(parents=True)
    (path / "model.safetensors").write_text(text)
    return path


def test_publish_replaces_the_draft_and_leaves_nothing_beside_it(tmp_path):
    folder(tmp_path / "draft", "old")
    folder(tmp_path / "checkpoint-4" / "draft", "new")
    publish_draft(tmp_path / "checkpoint-4", tmp_path)
    assert (tmp_path / "draft" / "model.safetensors").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-4", "draft"]
    assert latest(tmp_path) == tmp_path / "checkpoint-4"


def test_a_kill_between_the_renames_keeps_the_old_folder_whole(tmp_path, monkeypatch):
    final = folder(tmp_path / "draft", "old")
    new = folder(tmp_path / ".draft.tmp", "new")
    real, calls = Path.rename, []

    def rename(self, target):
        calls.append(self.name)
        if len(calls) == 2:  # the new folder's rename: the process dies here
            raise KeyboardInterrupt
        return real(self, target)

    monkeypatch.setattr(Path, "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        replace_dir(new, final)
    monkeypatch.undo()
    assert (tmp_path / ".draft.old" / "model.safetensors").read_text() == "old"  # whole, beside it
    assert (new / "model.safetensors").read_text() == "new"
    replace_dir(new, final)  # the next publish puts the new one in place and clears the old
    assert (final / "model.safetensors").read_text() == "new" and not (tmp_path / ".draft.old").exists()
