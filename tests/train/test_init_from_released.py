"""EAGLE-3 forward variants in training (toolkit/infer/eagle3_config.py): a released head in speculators' layout
trained on keeps its variant (trained with and exported, not dropped); a recipe may ask for them."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from toolkit.cli import main
from toolkit.train.tracking import read_metrics

COMMON = ["batch_size=2", "max_len=96", "log_every=1", "eval_samples=2", "eval_every=0", "threads=1",
          "warmup_ratio=0", "mixed_precision=no", "max_steps=1", "lr=1e-12", "save_every=1"]


def train(tiny_target, prepared, out, *extra, flags=()):
    return main(["train", "--model", str(tiny_target), "--data", str(prepared), "--output-dir", str(out), *flags,
                 *COMMON, *extra])


def as_speculators(draft, folder, norm_before_residual: bool):
    """Our export rewritten as speculators saves an eagle3 head: the layer config nested, layers.0.* names."""
    cfg = json.loads((draft / "config.json").read_text())
    layer = {k: cfg[k] for k in ("model_type", "hidden_size", "intermediate_size", "num_attention_heads",
                                 "num_key_value_heads", "head_dim", "num_hidden_layers", "vocab_size",
                                 "rms_norm_eps", "max_position_embeddings", "rope_theta")}
    spec = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
            "draft_vocab_size": cfg["draft_vocab_size"], "norm_before_residual": norm_before_residual,
            "eagle_aux_hidden_state_layer_ids": cfg["eagle_aux_hidden_state_layer_ids"],
            "transformer_layer_config": layer}
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(spec))
    w = load_file(str(draft / "model.safetensors"))
    save_file({k.replace("midlayer.", "layers.0."): v for k, v in w.items()}, str(folder / "model.safetensors"))


def test_a_speculators_head_is_trained_on_with_its_norm_before_residual(tiny_target, prepared, tmp_path, capsys):
    first = tmp_path / "first"
    assert train(tiny_target, prepared, first, "max_steps=6", "lr=3e-3", "save_every=6") == 0
    runs = {}
    for flag in (True, False):
        spec = tmp_path / f"spec_{flag}"
        as_speculators(first / "draft", spec, flag)
        out = tmp_path / f"on_{flag}"
        capsys.readouterr()
        assert train(tiny_target, prepared, out, f"init_from={spec}") == 0
        said = "".join(capsys.readouterr())
        assert ("SGLang's LlamaForCausalLMEagle3 reads neither" in said) == flag  # for the variant only
        cfg = json.loads((out / "draft" / "config.json").read_text())
        assert cfg.get("norm_before_residual", False) == flag
        runs[flag] = [r["loss"] for r in read_metrics(out / "metrics.jsonl") if "loss" in r][0]
        w_in, w_out = load_file(str(spec / "model.safetensors")), load_file(str(out / "draft" / "model.safetensors"))
        assert torch.allclose(w_in["fc.weight"].float(), w_out["fc.weight"].float(), atol=1e-2)
        from safetensors import safe_open

        (vmap,) = out.glob("vocab_map_*.safetensors")
        with safe_open(str(vmap), "pt") as f:  # the vocabulary is the started-from draft's, and says so
            assert f.metadata()["method"] == "init_from"
    # the same weights under the two forwards: a different loss, so the variant is what was trained
    assert abs(runs[True] - runs[False]) > 1e-3 * runs[False]


def test_a_recipe_trains_the_variants_and_init_from_may_not_add_one(tiny_target, prepared, tmp_path, capsys):
    """norm_before_residual / norm_before_fc as recipe keys: the export carries them (input_norm.weight too); an
    init_from draft without one refuses a recipe asking for it; a resume may not change them."""
    out = tmp_path / "v"
    assert train(tiny_target, prepared, out, "norm_before_residual=true", "norm_before_fc=true") == 0
    cfg = json.loads((out / "draft" / "config.json").read_text())
    assert cfg["norm_before_residual"] is True and cfg["norm_before_fc"] is True
    assert load_file(str(out / "draft" / "model.safetensors"))["input_norm.weight"].shape == (3 * cfg["hidden_size"],)
    assert "SGLang's LlamaForCausalLMEagle3 reads neither" in "".join(capsys.readouterr())
    plain = tmp_path / "plain"
    assert train(tiny_target, prepared, plain) == 0
    capsys.readouterr()
    assert train(tiny_target, prepared, tmp_path / "x", f"init_from={plain / 'draft'}", "norm_before_fc=true") == 2
    assert "norm_before_fc: the init_from draft" in capsys.readouterr().err
    assert train(tiny_target, prepared, out, "max_steps=2", "norm_before_fc=true", "norm_before_residual=false",
                 flags=["--resume"]) == 2
    assert "norm_before_residual was True, now False" in capsys.readouterr().err
    assert main(["train", "--model", str(tiny_target), "--data", str(prepared), "--output-dir", str(tmp_path / "e"),
                 "head=eagle", "norm_before_fc=true", *COMMON]) == 2
    assert "EAGLE-3 variants, not for an eagle head" in capsys.readouterr().err


def test_init_from_takes_a_released_head_by_its_hub_id(tiny_target, tiny_draft, tmp_path, monkeypatch):
    """init_from=org/name (a released head) is read from the HF cache (fetched first when the hub is reachable)."""
    import huggingface_hub.constants

    from toolkit.infer.config import ModelConfig
    from toolkit.train.head import start_from, target_tensors

    repo = tmp_path / "hub" / "models--org--head"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("a" * 40)
    (repo / "snapshots" / ("a" * 40)).mkdir(parents=True)
    for f in tiny_draft.iterdir():
        (repo / "snapshots" / ("a" * 40) / f.name).write_bytes(f.read_bytes())
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    parts = target_tensors(tiny_target, ["embed_tokens.weight", "lm_head.weight"])
    head = start_from("eagle3", "org/head", ModelConfig.from_folder(tiny_target), parts)
    local = start_from("eagle3", tiny_draft, ModelConfig.from_folder(tiny_target), parts)
    assert all(torch.equal(a, b) for a, b in zip(head.state_dict().values(), local.state_dict().values()))
    with pytest.raises(ValueError, match="init_from org/absent: HF_HUB_OFFLINE is set"):
        start_from("eagle3", "org/absent", ModelConfig.from_folder(tiny_target), parts)
