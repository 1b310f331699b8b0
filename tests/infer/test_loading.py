"""The load-time probe prints the draft's top-1 agreement with the target, and warns when it is near zero."""
import pytest

from toolkit.infer.loading import probe

TEXT = "The quick brown fox jumps over the lazy dog, then runs into the forest to find its friends."


@pytest.fixture(scope="module")
def target_and_tok(tiny_target):
    from toolkit.data.chat import load_tokenizer
    from toolkit.infer.loading import load_target

    return load_target(tiny_target), load_tokenizer(model=str(tiny_target))


def test_a_random_head_gets_the_warning_with_its_figure(target_and_tok, capsys):
    from toolkit.infer.drafts import random_head

    target, tok = target_and_tok
    agree = probe(random_head(target.config, seed=1), target, tok, TEXT)
    err = capsys.readouterr().err
    assert agree < 0.02
    assert f"draft/target top-1 agreement over the target's answer to a probe prompt: {agree:.1%}" in err
    assert "WARNING: the draft almost never agrees with the target" in err


def test_a_head_that_agrees_gets_its_figure_and_no_warning(target_and_tok, capsys, monkeypatch):
    import toolkit.infer.drafts

    target, tok = target_and_tok
    monkeypatch.setattr(toolkit.infer.drafts, "agreement", lambda head, target, ids, start=0: 0.5)
    assert probe(object(), target, tok, TEXT) == 0.5
    err = capsys.readouterr().err
    assert "top-1 agreement over the target's answer to a probe prompt: 50.0%" in err and "WARNING" not in err


def test_a_draft_served_without_model_is_checked_against_the_target_it_records(tiny_target, tmp_path):
    """docs/formats.md section 7: with no --model the draft's recorded target is resolved and its fingerprint
    checked too (only --model was checked: a changed target was served without a word)."""
    import json
    import shutil

    from toolkit.infer.config import ModelConfig
    from toolkit.infer.drafts import random_head, save_eagle3
    from toolkit.infer.loading import draft_target
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

    from toolkit.infer.loading import draft_kind

    with pytest.raises(ValueError, match=r"this is a target model \(LlamaForCausalLM, \d+ layers\), not a draft "
                                         r"folder; give it as --model"):
        draft_kind(tiny_target)
    shutil.copytree(tiny_draft, tmp_path / "run" / "draft")  # what a training run's --output-dir holds
    with pytest.raises(FileNotFoundError, match=r"no config.json there; .*run/draft is a draft \(a training run"):
        draft_kind(tmp_path / "run")
    with pytest.raises(FileNotFoundError, match=r"draft .*run/drafts: no such folder"):  # a typo
        draft_kind(tmp_path / "run" / "drafts")
    from toolkit.infer.loading import recorded_target

    with pytest.raises(ValueError, match=r"--draft .*run: no config.json there; .*run/draft is a draft"):
        recorded_target(str(tmp_path / "run"))
    assert draft_kind(tmp_path / "run" / "draft") == "eagle3"
