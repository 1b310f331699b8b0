"""Checkpoint folders are replaced whole: a kill between steps never leaves a half-deleted folder; a
checkpoint holds what training changes, not the target's frozen copies."""
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_model, save_file
from torch import nn

from toolkit.train.checkpoint import latest, load_head, publish_draft, replace_dir
from toolkit.train.objectives import DraftTrainable


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


class Head(nn.Module):
    """An eagle-like head: a trained layer and the target's lm_head, frozen."""

    def __init__(self, lm_head: torch.Tensor):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.lm_head = nn.Linear(4, lm_head.shape[0], bias=False)
        self.lm_head.weight = nn.Parameter(lm_head, requires_grad=False)


def trainable(seed: int) -> DraftTrainable:
    torch.manual_seed(seed)
    return DraftTrainable(Head(torch.randn(10, 4)), torch.randn(10, 4), 2)


def test_a_checkpoint_leaves_the_targets_frozen_copies_out_and_loads_without_them(tmp_path):
    a, b = trainable(0), trainable(1)
    state = a.state_dict()
    assert sorted(state) == ["head.fc.bias", "head.fc.weight"]  # no embed.weight, no head.lm_head.weight
    # as accelerate saves and loads a model (safetensors, strict): the frozen copies are not asked for
    save_file(state, str(tmp_path / "model.safetensors"))
    missing, unexpected = load_model(b, str(tmp_path / "model.safetensors"))
    assert not missing and not unexpected and torch.equal(a.head.fc.weight, b.head.fc.weight)
    assert not torch.equal(a.embed.weight, b.embed.weight)  # b keeps its own (the target's, at a real start)
    # an older checkpoint that holds them loads as before; under a wrapper (DDP's `module.`) too
    full = {**state, "embed.weight": a.embed.weight, "head.lm_head.weight": a.head.lm_head.weight}
    b.load_state_dict(full)
    assert torch.equal(a.embed.weight, b.embed.weight)
    wrapper = nn.Module()
    wrapper.module = trainable(2)
    assert sorted(wrapper.state_dict()) == ["module.head.fc.bias", "module.head.fc.weight"]
    wrapper.load_state_dict({"module." + k: v for k, v in state.items()})
    # a trained weight missing is still an error
    with pytest.raises(RuntimeError, match="head.fc.bias"):
        b.load_state_dict({"head.fc.weight": state["head.fc.weight"]})


def test_the_exported_head_takes_its_frozen_copies_from_its_template_and_nothing_else():
    a, template = trainable(0), Head(torch.zeros(10, 4))
    load_head(template, a.state_dict())
    assert torch.equal(template.fc.weight, a.head.fc.weight) and not template.lm_head.weight.any()
    with pytest.raises(RuntimeError, match=r"missing \['fc.bias'\]"):
        load_head(template, {"head.fc.weight": a.head.fc.weight})
    with pytest.raises(RuntimeError, match="unexpected"):
        load_head(template, {**a.state_dict(), "head.extra": torch.zeros(1)})
