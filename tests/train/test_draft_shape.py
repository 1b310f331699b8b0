"""A recipe's draft_config (SpecForge's --draft-model-config): the head trained has the file's layers, MLP width,
attention shape, draft vocabulary and aux layers; it exports, loads and serves losslessly; what disagrees with the
recipe or the target is refused by name."""
from __future__ import annotations

import json

import pytest

from toolkit.cli import main
from toolkit.train.config import TrainConfig

# SpecForge's configs/qwen3-4b-eagle3.json in small: a draft layer whose heads are narrower than the target's
# (tiny_target: hidden 64, 4 heads of 16, 2 KV heads, MLP 128)
SPEC = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 64, "head_dim": 8,
        "num_attention_heads": 8, "num_key_value_heads": 4, "intermediate_size": 96, "num_hidden_layers": 1,
        "rms_norm_eps": 1e-6, "vocab_size": 49152, "draft_vocab_size": 2048, "tie_word_embeddings": False,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 5]}}


def spec_file(tmp_path, **change) -> str:
    path = tmp_path / "draft.json"
    path.write_text(json.dumps({**SPEC, **change}))
    return str(path)


def test_the_file_fills_the_recipes_head_keys(tmp_path):
    cfg = TrainConfig(data="x", draft_config=spec_file(tmp_path))
    assert (cfg.num_layers, cfg.draft_intermediate_size, cfg.draft_vocab_size, cfg.aux_layers) == (1, 96, 2048,
                                                                                                    [1, 3, 5])
    top = spec_file(tmp_path, eagle_config=None, eagle_aux_hidden_state_layer_ids=[2, 4, 6])  # SGLang's ids
    assert TrainConfig(data="x", draft_config=top).aux_layers == [1, 3, 5]
    agreeing = TrainConfig(data="x", draft_config=spec_file(tmp_path), draft_vocab_size=2048, aux_layers=[1, 3, 5])
    assert agreeing.draft_vocab_size == 2048


@pytest.mark.parametrize("change, recipe, message", [
    ({}, {"num_layers": 2}, "num_layers 2 and draft_config's num_hidden_layers 1 disagree: give one"),
    ({}, {"draft_vocab_size": 4096}, "draft_vocab_size 4096 and draft_config's draft_vocab_size 2048 disagree"),
    ({}, {"aux_layers": [1, 2, 3]}, "aux_layers [1, 2, 3] and draft_config's eagle_aux_hidden_state_layer_ids"),
    ({}, {"head": "eagle"}, "SpecForge's draft configs shape an EAGLE-3 head, not an eagle head"),
    ({}, {"init_from": "d"}, "draft_config and init_from both give the head's shape"),
    ({"num_attention_heads": 0}, {}, "num_attention_heads must be a positive integer, got 0"),
    ({"hidden_size": "64"}, {}, "hidden_size must be a positive integer, got '64'"),
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2]}}, {}, "give 3 target layer ids"),
])
def test_what_disagrees_is_refused_by_name(tmp_path, change, recipe, message):
    with pytest.raises(ValueError) as err:
        TrainConfig(data="x", draft_config=spec_file(tmp_path, **change), **recipe)
    assert message in str(err.value)


def test_a_file_that_is_not_a_config_is_named(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "list.json").write_text("[1]")
    for name, message in (("bad.json", "not valid JSON"), ("list.json", "a JSON object"), ("none.json", "No such")):
        with pytest.raises(ValueError, match=f"draft_config {tmp_path / name}.*{message}"):
            TrainConfig(data="x", draft_config=str(tmp_path / name))


def test_the_head_has_the_files_shape_and_serves_losslessly(tiny_target, prepared, tmp_path):
    """Trained from the file through the CLI: the export's config.json and tensors have its shape, and the bench
    serves it over the target with the greedy text of plain decoding."""
    import subprocess
    import sys

    from safetensors import safe_open

    out = tmp_path / "run"
    assert main(["train", "--model", str(tiny_target), "--data", str(prepared), "--output-dir", str(out),
                 f"draft_config={spec_file(tmp_path)}", "batch_size=2", "max_len=96", "eval_samples=2",
                 "eval_max_new_tokens=4", "threads=1", "mixed_precision=no", "max_steps=3", "save_every=3"]) == 0
    cfg = json.loads((out / "draft" / "config.json").read_text())
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["intermediate_size"],
            cfg["draft_vocab_size"]) == (8, 4, 8, 96, 2048)
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 5]
    with safe_open(str(out / "draft" / "model.safetensors"), "pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    assert shapes["midlayer.self_attn.q_proj.weight"] == (64, 128)    # 8 heads of 8 over [embedding, hidden]
    assert shapes["midlayer.self_attn.k_proj.weight"] == (32, 128)    # 4 KV heads of 8
    assert shapes["midlayer.mlp.gate_proj.weight"] == (96, 64) and shapes["lm_head.weight"] == (2048, 64)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "x", "turns": ["Tell me about rivers."]}) + "\n")
    done = subprocess.run([sys.executable, "-m", "toolkit.cli", "bench", "--draft", str(out / "draft"), "--prompts",
                           str(prompts), "--max-new-tokens", "12", "--num-steps", "3", "--topk", "2",
                           "--num-draft-tokens", "5", "--threads", "1", "--baseline", "--out",
                           str(tmp_path / "b.json")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "b.json").read_text())["greedy_identical_to_baseline"] is True


def test_a_file_for_another_target_is_refused_at_build(tiny_target, prepared, tmp_path, capsys):
    code = main(["train", "--model", str(tiny_target), "--data", str(prepared), "--output-dir", str(tmp_path / "r"),
                 f"draft_config={spec_file(tmp_path, hidden_size=2560)}", "max_steps=1", "threads=1",
                 "mixed_precision=no"])
    assert code == 2
    assert "is not for this target (llama): hidden_size 2560 != the target's 64" in capsys.readouterr().err
