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
