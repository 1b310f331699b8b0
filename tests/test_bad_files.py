"""Files a user hands over damaged or wrong (found by fuzzing the CLI): a clear error naming the file and what to do,
never a traceback, and before minutes of loading where the file is read first."""
import json
import shutil

import pytest
import torch

from toolkit.cli import main


def test_a_target_cut_short_names_its_file(tiny_target, tmp_path, capsys):
    """An interrupted download: safetensors' 'incomplete metadata, file not fully covered' reached the user as a
    SafetensorError traceback from bench, serve, train, regenerate and dump-hidden-states alike."""
    from toolkit.infer.loading import load_target

    cut = tmp_path / "cut"
    shutil.copytree(tiny_target, cut)
    weights = cut / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ValueError, match=rf"target weights {weights}: unreadable \(.*\); a file cut short by an "
                                         "interrupted download or copy"):
        load_target(cut)
    (tmp_path / "d.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    assert main(["regenerate", "--model", str(cut), "--data", str(tmp_path / "d.jsonl"), "--out",
                 str(tmp_path / "o.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "unreadable" in err and "Traceback" not in err and not (tmp_path / "o.jsonl").exists()


def test_a_chat_template_with_a_syntax_error_or_not_utf8_is_named(tiny_target, tmp_path):
    from toolkit.data.tokenizer import TokenizerError, load_tokenizer

    (tmp_path / "bad.jinja").write_text("{% for m in messages %}{{ m.content }{% endfor %}")
    with pytest.raises(TokenizerError, match=r"--chat-template .*bad.jinja: a Jinja syntax error at line 1: "):
        load_tokenizer(model=str(tiny_target), chat_template=str(tmp_path / "bad.jinja"))
    (tmp_path / "latin1.jinja").write_bytes("{% for m in messages %}{{ m.content }}é{% endfor %}".encode("latin-1"))
    with pytest.raises(TokenizerError, match=r"latin1.jinja: not UTF-8 text"):
        load_tokenizer(model=str(tiny_target), chat_template=str(tmp_path / "latin1.jinja"))
    own = tmp_path / "own"  # a model folder whose own template is broken
    shutil.copytree(tiny_target, own)
    cfg = json.loads((own / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{{ messages[0].content }"
    (own / "tokenizer_config.json").write_text(json.dumps(cfg))
    (own / "chat_template.jinja").unlink(missing_ok=True)
    with pytest.raises(TokenizerError, match=r"own's chat template: a Jinja syntax error"):
        load_tokenizer(model=str(own))


def test_a_recipe_with_keys_that_are_not_names_and_absurd_threads(tmp_path):
    from toolkit.train.config import TrainConfig
    from toolkit.train.recipe import load_config

    (tmp_path / "r.yaml").write_text("1: x\nfoo: y\n")
    with pytest.raises(ValueError, match=r"r.yaml: keys \[1\] are not names"):
        load_config(str(tmp_path / "r.yaml"))
    with pytest.raises(ValueError, match=r"threads 100000: give a number of CPU threads from 1 to 1024"):
        TrainConfig(data="x", threads=100000)  # torch.set_num_threads(100000) crashed the process


def test_a_damaged_checkpoint_is_named_on_resume(tmp_path):
    from accelerate import Accelerator

    from toolkit.train import checkpoint as ckpt

    acc = Accelerator(cpu=True)
    model, opt = acc.prepare(torch.nn.Linear(4, 4), torch.optim.AdamW(torch.nn.Linear(4, 4).parameters()))
    acc.save_state(str(tmp_path / "checkpoint-2"))
    weights = tmp_path / "checkpoint-2" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:40])
    with pytest.raises(ValueError, match=r"cannot resume from .*checkpoint-2: it is damaged \(.*\); delete that "
                                         "folder to resume from the checkpoint before it"):
        ckpt.load(acc, tmp_path / "checkpoint-2")
    weights.unlink()  # missing: accelerate looked for pytorch_model.bin and named that
    with pytest.raises(ValueError, match=r"cannot resume from .*checkpoint-2: it is damaged"):
        ckpt.load(acc, tmp_path / "checkpoint-2")


def test_bench_reads_its_prompts_and_shard_before_loading_the_draft(tmp_path, capsys):
    (tmp_path / "p.jsonl").write_text(json.dumps({"turns": ["hi"]}) + "\n" + "{not json\n")
    for extra, named in ((["--shard", "x"], "--shard 'x'"), ([], "p.jsonl")):
        assert main(["bench", "--draft", str(tmp_path / "no-such-draft"), "--prompts", str(tmp_path / "p.jsonl"),
                     *extra]) == 2
        err = capsys.readouterr().err
        assert named in err and "no-such-draft" not in err


def test_seeds_beyond_what_torch_takes_are_refused_before_loading(tmp_path, capsys):
    """`Overflow when unpacking long long` came after the model loaded."""
    from toolkit.train.config import TrainConfig

    big = str(2 ** 64)
    with pytest.raises(SystemExit):  # argparse's usage error
        main(["bench", "--draft", "nowhere", "--prompts", "p.jsonl", "--seed", big])
    assert f"argument --seed: {big}: give an integer from -9223372036854775808" in capsys.readouterr().err
    with pytest.raises(ValueError, match=rf"seed {big}: give an integer from -9223372036854775808 to"):
        TrainConfig(data="x", seed=2 ** 64)
    assert TrainConfig(data="x", seed=2 ** 64 - 1).seed == 2 ** 64 - 1


def test_broken_json_files_of_a_folder_are_named(tiny_target, tmp_path):
    """json's own message ("Expecting property name: line 1 column 2") named no file."""
    from toolkit.infer.config import ModelConfig
    from toolkit.train.data import PreparedData

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{'model_type': 'llama'}")
    with pytest.raises(ValueError, match=r"m/config.json: not valid JSON \(Expecting property name enclosed in "
                                         r"double quotes at line 1, column 2\)"):
        ModelConfig.from_folder(tmp_path / "m")
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "toolkit_prepare.json").write_text("{")
    with pytest.raises(ValueError, match=r"prepared data .*p/toolkit_prepare.json: not valid JSON"):
        PreparedData(tmp_path / "p", 64)


def test_json_of_the_wrong_shape_in_a_draft_or_a_dump_is_named(tmp_path):
    """Valid JSON, wrong shape (hand-edited): AttributeError / TypeError tracebacks before."""
    from toolkit.infer.draft_folder import recorded_target
    from toolkit.train.data import read_index

    for i, cfg in enumerate((None, [], {"toolkit": "x"})):
        (tmp_path / f"d{i}").mkdir()
        (tmp_path / f"d{i}" / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(ValueError, match=r"config.json: a draft's config.json is a JSON object"):
            recorded_target(str(tmp_path / f"d{i}"))
    for i, index in enumerate(([], {"aux_layer_ids": None, "shards": []}, {"aux_layer_ids": [1, 2, 3], "shards": None},
                               {"aux_layer_ids": [1, 2, 3], "shards": [{"file": "a"}]})):
        (tmp_path / f"h{i}").mkdir()
        (tmp_path / f"h{i}" / "index.json").write_text(json.dumps(index))
        with pytest.raises(ValueError, match=r"index.json: not the layout `toolkit dump-hidden-states` writes"):
            read_index(tmp_path / f"h{i}")


def test_a_target_or_draft_config_of_the_wrong_shape_is_named_not_a_traceback(tiny_target, tiny_draft, tmp_path,
                                                                               capsys):
    """A config.json that parses but is no object, or has a size that is null / a string, or aux layer ids that
    are no list: AttributeError / TypeError tracebacks from bench, serve, train, regenerate before."""
    from toolkit.infer.config import ModelConfig
    from toolkit.infer.draft_folder import draft_kind
    from toolkit.models import resolve_target

    target = tmp_path / "t"
    shutil.copytree(tiny_target, target)
    (target / "config.json").write_text("[]")
    with pytest.raises(ValueError, match=r"config.json holds list, not a JSON object"):
        resolve_target(str(target))
    assert main(["bench", "--model", str(target), "--draft", str(tiny_draft), "--prompts", "x.jsonl"]) == 2
    assert "Traceback" not in capsys.readouterr().err
    cfg = json.loads((tiny_target / "config.json").read_text())
    for key, value in (("num_hidden_layers", None), ("hidden_size", "abc")):
        with pytest.raises(ValueError, match=rf"{value!r}.*positive integer|positive integer, got {value!r}"):
            ModelConfig.from_hf({**cfg, key: value})
    draft = tmp_path / "d"
    shutil.copytree(tiny_draft, draft)
    (draft / "config.json").write_text("[1]")
    with pytest.raises(ValueError, match=r"config.json holds list, not a JSON object"):
        draft_kind(draft)
    dcfg = json.loads((tiny_draft / "config.json").read_text())
    (draft / "config.json").write_text(json.dumps({**dcfg, "eagle_aux_hidden_state_layer_ids": "1,2,3"}))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"turns": ["hi"]}) + "\n")
    assert main(["bench", "--model", str(tiny_target), "--draft", str(draft), "--prompts", str(prompts)]) == 2
    err = capsys.readouterr().err
    assert "eagle_aux_hidden_state_layer_ids '1,2,3': give a list of layer ids" in err and "Traceback" not in err
