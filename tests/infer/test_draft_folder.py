"""A draft folder (toolkit/infer/draft_folder.py): the target it records is resolved and checked by fingerprint,
and a folder that is no draft (a target, a training run, a typo) is named for what it is."""
import pytest

from toolkit.infer.draft_folder import draft_kind, draft_target, recorded_target


def test_a_draft_served_without_model_is_checked_against_the_target_it_records(tiny_target, tmp_path):
    """docs/formats.md section 7: with no --model the draft's recorded target is resolved and its fingerprint
    checked too (only --model was checked: a changed target was served without a word)."""
    import json
    import shutil

    from toolkit.infer.config import ModelConfig
    from toolkit.infer.drafts import random_head, save_eagle3
    from toolkit.models import fingerprint

    target = tmp_path / "target"
    shutil.copytree(tiny_target, target)
    cfg = json.loads((target / "config.json").read_text())
    draft = tmp_path / "draft"
    save_eagle3(random_head(ModelConfig.from_folder(target), list(range(0, cfg["vocab_size"], 5))), draft, cfg,
                str(target), fingerprint(target))
    assert draft_target(str(draft), None) == target
    cfg = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**cfg, "rms_norm_eps": 1e-3}))
    with pytest.raises(ValueError, match=r"the target it records, .* is not the target the draft .* this "
                                         r"target's is [0-9a-f]{16}"):
        draft_target(str(draft), None)


def test_a_target_or_a_run_folder_given_as_the_draft_is_named_for_what_it_is(tiny_target, tiny_draft, tmp_path):
    import shutil

    with pytest.raises(ValueError, match=r"this is a target model \(LlamaForCausalLM, \d+ layers\), not a draft "
                                         r"folder; give it as --model"):
        draft_kind(tiny_target)
    shutil.copytree(tiny_draft, tmp_path / "run" / "draft")  # what a training run's --output-dir holds
    with pytest.raises(FileNotFoundError, match=r"no config.json there; .*run/draft is a draft \(a training run"):
        draft_kind(tmp_path / "run")
    with pytest.raises(FileNotFoundError, match=r"draft .*run/drafts: no such folder"):  # a typo
        draft_kind(tmp_path / "run" / "drafts")
    with pytest.raises(ValueError, match=r"--draft .*run: no config.json there; .*run/draft is a draft"):
        recorded_target(str(tmp_path / "run"))
    assert draft_kind(tmp_path / "run" / "draft") == "eagle3"
