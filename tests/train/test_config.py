"""Recipes and key=value overrides."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from toolkit.train.config import TrainConfig
from toolkit.train.recipe import load_config

RECIPES = sorted((Path(__file__).resolve().parents[2] / "recipes").glob("*.yaml"))


def test_overrides_are_typed_and_flags_win(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("data: a\nlr: 1.0e-4\nttt_steps: 7\n")
    cfg = load_config(str(recipe), ["lr=3e-4", "aux_layers=[1, 5, 9]", "max_steps=12", "token_map=null"],
                      data="b", output_dir=None)
    assert cfg.lr == 3e-4 and cfg.aux_layers == [1, 5, 9] and cfg.max_steps == 12 and cfg.data == "b"
    assert cfg.token_map is None and cfg.ttt_steps == 7
    recipe.write_text("data: a\nmixed_precision: no\n")  # YAML 1.1 reads a bare `no` as false
    assert load_config(str(recipe)).mixed_precision == "no"
    assert load_config(str(recipe), ["mixed_precision=no"]).mixed_precision == "no"
    assert load_config(str(recipe), ["mixed_precision=bf16"]).mixed_precision == "bf16"


@pytest.mark.parametrize("override, words", [
    (["lr=fast"], "lr='fast': expected float"),
    (["ttt_steps=0"], "ttt_steps 0"),
    (["nonsense=1"], "unknown config keys ['nonsense']; accepted:"),
    (["eval_sample=2", "max-steps=3"], "(eval_sample: did you mean eval_samples?; max-steps: did you mean max_steps?)"),
    # SpecForge's names say what is meant here, not a near miss (difflib read total_steps as ttt_steps)
    (["total_steps=100", "learning_rate=1e-4"], "(learning_rate is SpecForge's; here it is lr; total_steps is "
                                                "SpecForge's; here it is schedule_steps (the schedule's length; "
                                                "max_steps stops the run))"),
    (["schedule_steps=0"], "schedule_steps 0: must be at least 1"),
    (["dist_timeout=0"], "dist_timeout 0.0: give the minutes ranks wait, > 0"),
    (["report_to=[tensorbored]"], "report_to ['tensorbored']: accepted"),
    (["ttt-length=7"], "ttt-length is SpecForge's; here it is ttt_steps"),
    (["tp_size=2"], "tp_size is SpecForge's, not taken here: the target is loaded whole on each process"),
    (["init_lm_head=zeros"], "accepted target, random"),
    (["aux_layers=[1,2]"], "give 3 target layer ids"),
    (["mixed_precision=fp8"], "mixed_precision 'fp8': accepted auto, no, bf16, fp16"),
    (["lr"], "write key=value"),
    (["fc_bias=true"], "only an eagle head's fc may have a bias"),
    # once passed or crashed: a YAML syntax error was a yaml traceback, `output_dir=` became the folder 'None', a
    # list for a str key or strings in aux_layers passed, and a negative or NaN max_grad_norm (gradient ascent / NaN
    # weights), a negative weight decay, an infinite lr or epochs and threads=-1 reached the run
    (["lr=[1"], "lr='[1': not a YAML value"),
    (["extra={a: [1"], "extra='{a: [1': not a YAML value"),
    (["output_dir="], "output_dir='': empty; expected str"),
    # `hidden_states=$UNSET` trained online without a word (loading the target); null still says none on purpose
    (["hidden_states="], "hidden_states='': empty; give a value, or null for none"),
    (["token_map= "], "token_map=' ': empty; give a value, or null for none"),
    (["model=[1,2]"], "model='[1,2]': expected str, got a list"),
    (["aux_layers=[a,b,c]"], "a list of integers"),
    (["max_grad_norm=-1"], "max_grad_norm -1.0: must be a finite number > 0"),
    (["max_grad_norm=nan"], "max_grad_norm nan"),
    (["weight_decay=-0.1"], "weight_decay -0.1: must be a finite number >= 0"),
    (["lr=inf"], "lr inf: must be a finite number"),
    (["epochs=.inf"], "epochs inf"),
    (["regression_weight=nan", "head=eagle"], "regression_weight nan"),
    (["threads=-1"], "threads -1"),
    # one sentence for all of them named neither the key nor its value
    (["lr=-1"], "lr -1.0: must be > 0"), (["epochs=0"], "epochs 0.0: must be > 0"),
    (["warmup_ratio=1"], "warmup_ratio 1.0: must be in [0, 1)"), (["loss_decay=0"], "loss_decay 0.0: must be in"),
    (["eval_every=-1"], "eval_every -1: must be >= 0"),
])
def test_bad_values_are_named(override, words):
    with pytest.raises(ValueError) as err:
        load_config(None, ["data=x", *override])
    assert words in str(err.value)


def test_a_recipe_that_is_not_yaml_is_named(tmp_path):
    bad = tmp_path / "r.yaml"
    bad.write_text("lr: [1\nttt_steps: 2\n")
    with pytest.raises(ValueError, match=r"--config .*r\.yaml: not a YAML text \(.*line 2\)"):
        load_config(str(bad))
    bad.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match="not a YAML text"):
        load_config(str(bad))


def test_overrides_may_come_before_or_after_the_options(capsys):
    """`toolkit train --config r.yaml --output-dir run num_layers=2` is how people type it; argparse alone
    refuses words after an option, so the command line collects them as overrides (other words still fail)."""
    from toolkit.cli import build_parser
    from toolkit.train.launch import add_args, cli, parse_with_overrides

    parser = build_parser()
    args = parse_with_overrides(parser, ["train", "lr=1e-3", "--config", "r.yaml", "--output-dir", "run",
                                         "num_layers=2", "ttt_steps=9"])
    assert args.overrides == ["lr=1e-3", "num_layers=2", "ttt_steps=9"] and args.output_dir == "run"
    for argv in (["train", "--output-dir", "run", "--bogus"], ["train", "a=1", "--output-dir", "run", "stray"],
                 ["bench", "--draft", "d", "--prompts", "p", "lr=1"]):
        with pytest.raises(SystemExit) as stop:
            parse_with_overrides(build_parser(), argv)
        assert stop.value.code == 2
        assert "unrecognized arguments: " + argv[-1] in capsys.readouterr().err
    import argparse

    entry = argparse.ArgumentParser()
    add_args(entry)  # the entry scripts' (accelerate launch toolkit/train/eagle3.py ...) parser too
    assert parse_with_overrides(entry, ["--data", "x", "max_steps=3"]).overrides == ["max_steps=3"]
    assert cli("eagle3.py", "doc", "eagle3", ["--output-dir", "o", "nonsense=1", "data=x"]) == 2
    assert "unknown config keys ['nonsense']" in capsys.readouterr().err


def test_the_entry_scripts_end_on_ctrl_c_and_sigterm_without_a_traceback(monkeypatch, capsys):
    """`accelerate launch toolkit/train/eagle3.py` printed a KeyboardInterrupt traceback on Ctrl-C and took SIGTERM
    with no unwinding (no temp folder removed): both end as `toolkit train` ends them, 130 and 143."""
    import os
    import signal

    from toolkit.train import trainer
    from toolkit.train.launch import cli

    monkeypatch.setattr(trainer, "main", lambda args, kind: (_ for _ in ()).throw(KeyboardInterrupt()))
    assert cli("eagle3.py", "doc", "eagle3", ["--output-dir", "o", "data=x"]) == 130
    assert "eagle3.py: interrupted; nothing half-written" in capsys.readouterr().err
    monkeypatch.setattr(trainer, "main", lambda args, kind: os.kill(os.getpid(), signal.SIGTERM) or 0)
    assert cli("eagle3.py", "doc", "eagle3", ["--output-dir", "o", "data=x"]) == 143
    assert "eagle3.py: terminated" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is not None and "Traceback" not in capsys.readouterr().err


def test_data_is_required():
    with pytest.raises(ValueError, match="prepared dataset folder"):
        TrainConfig()


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_every_recipe_loads_and_its_header_gives_the_command(recipe):
    cfg = load_config(str(recipe))
    assert cfg.ttt_steps == {"eagle3": 7, "eagle": 1, "mtp": 3}[cfg.head] and cfg.max_grad_norm == 0.5
    # it names its head, so that another kind's entry script refuses it (mtp.py trained an MTP head from an
    # EAGLE-3 recipe that left head to the default)
    assert f"\nhead: {cfg.head}\n" in recipe.read_text()
    from toolkit.train.trainer import main

    other = next(k for k in ("eagle3", "eagle", "mtp") if k != cfg.head)
    with pytest.raises(ValueError, match=f"the recipe trains an {cfg.head} head"):
        main(argparse.Namespace(config=str(recipe), overrides=[], model=None, data=None, output_dir=None,
                                max_steps=None, token_map=None, hidden_states=None), other)
    header = " ".join(line.lstrip("#").strip().rstrip("\\").strip() for line in recipe.read_text().splitlines()
                      if line.startswith("#"))
    assert f"toolkit/train/{cfg.head}.py --config recipes/{recipe.name}" in header
    assert recipe.name.endswith(f"-{cfg.head}.yaml")
    if "8b" in recipe.name:
        assert 5e-5 <= cfg.lr <= 1e-4 and cfg.max_len == 2048
    # every `toolkit ...` command the header gives parses as written (the Llama recipe's prepare-data line once
    # lacked its required --data and --out)
    import re
    import shlex

    from toolkit.cli import build_parser

    lines = [line.lstrip("#").strip() for line in recipe.read_text().splitlines() if line.startswith("#")]
    joined = "\n".join(lines).replace("\\\n", " ")
    for command in (line for line in joined.splitlines() if line.startswith("toolkit ")):
        try:
            build_parser().parse_args(shlex.split(re.sub(r"\[([^]]*)\]", r"\1", command))[1:])  # [optional]
        except SystemExit:
            pytest.fail(f"{recipe.name}: its header's command does not parse: {command}")


def test_launcher_configs_name_files_that_exist():
    import yaml

    root = RECIPES[0].parent
    for f in (root / "accelerate").glob("*.yaml"):
        conf = yaml.safe_load(f.read_text())
        ds = (conf.get("deepspeed_config") or {}).get("deepspeed_config_file")
        assert ds is None or (root.parent / ds).is_file(), f


def test_aux_layers_sglang_and_vllm_would_serve_otherwise_are_refused_or_said():
    """Asked-for aux layers that SGLang / vLLM capture otherwise (out of order, the last layer) are refused; a
    small target's default that does so, and extra draft layers (which SGLang does not serve), are said."""
    from toolkit.train.head import serving_notes

    assert serving_notes(TrainConfig(data="d", aux_layers=[1, 14, 26]), [1, 14, 26], 30) == []
    for ids in ([26, 14, 1], [1, 14, 29]):
        with pytest.raises(ValueError, match="aux_layers"):
            serving_notes(TrainConfig(data="d", aux_layers=ids), ids, 30)
    assert "strictly increasing" in serving_notes(TrainConfig(data="d"), [0, 1, 1], 2)[0]
    assert "SGLang" in serving_notes(TrainConfig(data="d", num_layers=2), [1, 14, 26], 30)[0]
    assert serving_notes(TrainConfig(data="d", head="eagle"), [-1], 30) == []


def test_a_resume_keeps_the_fc_bias_and_older_eagle_runs_had_one():
    from toolkit.train.config import check_resume

    cfg = load_config(None, ["data=x", "head=eagle"])
    with pytest.raises(ValueError, match="fc_bias was True, now False"):
        check_resume({"head": "eagle", "data": "x"}, cfg)      # a train_config.json from before the key
    check_resume({"head": "eagle", "data": "x", "fc_bias": False, "feature_noise": 0.1}, cfg)
    check_resume({"head": "eagle3", "data": "x"}, load_config(None, ["data=x"]))


def test_eagle_heads_read_noisy_features_by_default_and_older_runs_read_clean_ones():
    """EAGLE's augmentation: U(-0.1, 0.1) on an eagle head's input features unless told otherwise; the heads
    trained with training-time test take none. A run saved before the key trained on clean features, and a
    resume keeps that."""
    from toolkit.train.config import check_resume

    assert load_config(None, ["data=x", "head=eagle"]).feature_noise == 0.1
    assert load_config(None, ["data=x", "head=eagle", "feature_noise=0"]).feature_noise == 0.0
    assert load_config(None, ["data=x"]).feature_noise == 0.0 and TrainConfig(data="x", head="mtp").feature_noise == 0
    for bad, words in ((["feature_noise=0.1"], "an eagle3 head trains on clean features"),
                       (["head=eagle", "feature_noise=-1"], "feature_noise -1.0: give the uniform noise's half-width"),
                       (["head=eagle", "feature_noise=nan"], "feature_noise nan")):
        with pytest.raises(ValueError, match=words):
            load_config(None, ["data=x", *bad])
    old = {"head": "eagle", "data": "x", "fc_bias": False}  # a train_config.json from before the key
    with pytest.raises(ValueError, match="feature_noise was 0.0, now 0.1"):
        check_resume(old, load_config(None, ["data=x", "head=eagle"]))
    check_resume(old, load_config(None, ["data=x", "head=eagle", "feature_noise=0"]))


def test_the_draft_mlp_width_is_a_positive_eagle_setting_fixed_across_a_resume():
    """draft_intermediate_size (SpecForge gives gpt-oss-20b's head 17280 where the target's is 2880): an eagle3 /
    eagle head's, refused for an MTP block (the target's own kind) and when not positive; a resume keeps it."""
    from toolkit.train.config import check_resume

    assert load_config(None, ["data=x", "draft_intermediate_size=17280"]).draft_intermediate_size == 17280
    for bad in (["head=mtp", "draft_intermediate_size=64"], ["draft_intermediate_size=0"]):
        with pytest.raises(ValueError, match="draft_intermediate_size"):
            load_config(None, ["data=x", *bad])
    with pytest.raises(ValueError, match="draft_intermediate_size was 64, now None"):
        check_resume({"head": "eagle3", "data": "x", "draft_intermediate_size": 64}, load_config(None, ["data=x"]))
    check_resume({"head": "eagle3", "data": "x"}, load_config(None, ["data=x"]))  # a run from before the key


def test_dist_timeout_reaches_the_process_group(monkeypatch):
    """dist_timeout (SpecForge's dist-timeout, minutes): the ranks' process group waits that long, e.g. while rank 0
    counts a big corpus's vocabulary alone."""
    from datetime import timedelta

    import accelerate

    from toolkit.train.launch import make_accelerator

    seen = {}

    class Capture:
        def __init__(self, **kwargs):
            seen.update(kwargs)
            raise RuntimeError("captured")

    monkeypatch.setattr(accelerate, "Accelerator", Capture)
    with pytest.raises(RuntimeError, match="captured"):
        make_accelerator(load_config(None, ["data=x", "dist_timeout=90", "mixed_precision=no"]))
    (handler,) = seen["kwargs_handlers"]
    assert handler.timeout == timedelta(minutes=90)


def test_a_recipe_path_that_is_a_folder_or_absent_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="a folder, not a recipe file"):
        load_config(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no such recipe file"):
        load_config(str(tmp_path / "nope.yaml"))


def test_report_to_takes_a_name_a_list_or_comma_separated_names():
    """HF's and SpecForge's report_to is a name (or names): taken as given there."""
    assert load_config(None, ["data=x", "report_to=wandb"]).report_to == ["wandb"]
    assert load_config(None, ["data=x", "report_to=wandb,tensorboard"]).report_to == ["wandb", "tensorboard"]
    assert load_config(None, ["data=x", "report_to=[tensorboard]"]).report_to == ["tensorboard"]
    assert load_config(None, ["data=x", "report_to=[]"]).report_to == []
