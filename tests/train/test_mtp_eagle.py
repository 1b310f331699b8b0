"""MTP and EAGLE-1/2 heads trained by the shared loop on a tiny random target: multi-step loss falls, the
exported folders load in the engine and decode losslessly, the MTP block can start from the target's last
layer, offline shards give the online loss, and a recipe for another head is refused."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from toolkit.cli import main
from toolkit.infer.draft_folder import load_draft
from toolkit.infer.engine import Engine
from toolkit.infer.loading import load_target
from toolkit.infer.sampling import SamplingParams
from toolkit.infer.tree import TreeConfig
from toolkit.train.tracking import read_metrics

ROOT = Path(__file__).resolve().parents[2]
COMMON = ["batch_size=2", "max_len=96", "log_every=1", "eval_samples=2", "eval_max_new_tokens=6", "threads=1",
          "lr=3e-3", "warmup_ratio=0", "mixed_precision=no"]  # fp32 on any CPU: auto would time bf16 first


def train(head, tiny_target, prepared, out, *extra):
    return main(["train", "--model", str(tiny_target), "--data", str(prepared), "--output-dir", str(out),
                 f"head={head}", *COMMON, *extra])


def records(out):
    return [r for r in read_metrics(Path(out) / "metrics.jsonl") if "loss" in r]


def lossless(tiny_target, draft, tree):
    target = load_target(tiny_target)
    head = load_draft(str(draft), target, None)
    prompts = [[1, 520, 3300, 28, 991], [1, 44, 9000]]
    p = SamplingParams(max_new_tokens=20)
    want = [r.tokens for r in Engine(target, max_len=64, max_batch=2).generate_batch(prompts, p)]
    got = Engine(target, head, tree, max_len=64, max_batch=2).generate_batch(prompts, p)
    assert [r.tokens for r in got] == want
    return head


def test_mtp_multi_step_training_lowers_every_step_loss_and_serves_losslessly(tiny_target, prepared, tmp_path):
    out = tmp_path / "mtp"
    assert train("mtp", tiny_target, prepared, out, "max_steps=16", "ttt_steps=3", "save_every=16") == 0
    recs = records(out)
    first, last = recs[0], recs[-1]
    assert len(last["loss_i"]) == 3 and last["loss"] < 0.8 * first["loss"]
    assert all(b < a for a, b in zip(first["loss_i"], last["loss_i"])), (first["loss_i"], last["loss_i"])
    ev = [r for r in read_metrics(out / "metrics.jsonl") if "eval_engine_tau" in r][-1]
    assert ev["eval_engine_tau"] >= 1
    assert ev["eval_replay_differing_rows"] == 0 and ev["eval_replayed_tau"] == ev["eval_engine_tau"]
    cfg = json.loads((out / "draft/config.json").read_text())
    assert cfg["architectures"] == ["MiMoForCausalLM"] and cfg["toolkit"]["head"] == "mtp"
    assert sglang_draft_class(cfg["architectures"]) == "MiMoMTP"  # both servers reach their MiMo MTP class
    assert vllm_mtp_class(cfg["architectures"]) == "MiMoMTPModel"
    assert not list(out.glob("vocab_map_*"))  # the full vocabulary: no token map of its own
    head = lossless(tiny_target, out / "draft", TreeConfig(3, 1, 4))
    assert type(head).__name__ == "MTPHead"


def test_mtp_block_starts_from_the_target_last_layer_or_random(tiny_target, prepared, tmp_path):
    w = load_file(str(tiny_target / "model.safetensors"))
    last = {k.removeprefix("model.layers.7."): v for k, v in w.items() if k.startswith("model.layers.7.")}
    for init in ("target_last", "random"):
        out = tmp_path / init
        assert train("mtp", tiny_target, prepared, out, "max_steps=1", "lr=1e-12", "save_every=1",
                     f"init_block={init}", "eval_samples=0") == 0
        saved = load_file(str(out / "draft/model.safetensors"))
        q = saved["model.mtp_layers.0.self_attn.q_proj.weight"].float()
        same = torch.allclose(q, last["self_attn.q_proj.weight"].to(torch.bfloat16).float(), atol=1e-6)
        assert same == (init == "target_last")


def test_eagle_regression_training_exports_the_safeailab_layout(tiny_target, prepared, tmp_path):
    out = tmp_path / "eagle"
    assert train("eagle", tiny_target, prepared, out, "max_steps=16", "ttt_steps=2", "save_every=16") == 0
    recs = records(out)
    assert recs[-1]["loss"] < 0.8 * recs[0]["loss"] and len(recs[-1]["acc_i"]) == 2
    ev = [r for r in read_metrics(out / "metrics.jsonl") if "eval_engine_tau" in r][-1]
    assert ev["eval_replay_differing_rows"] == 0 and ev["eval_replayed_tau"] == ev["eval_engine_tau"]
    w = load_file(str(out / "draft/model.safetensors"))
    assert {"fc.weight", "fc.bias", "layers.0.self_attn.q_proj.weight"} <= set(w) and "lm_head.weight" not in w
    # trained without an fc bias (the recipe default): written as zeros, which SGLang's fc reads and vLLM skips
    assert not w["fc.bias"].any()
    cfg = json.loads((out / "draft/config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle", "EagleLlamaForCausalLM"]
    assert cfg["toolkit"]["head"] == "eagle" and cfg["toolkit"]["fc_bias"] is False
    # SGLang's and vLLM's Llama layers read a `bias` key as attention biases the head has not, and no loader
    # has a layer-0 input norm to put a written one in
    assert "bias" not in cfg and not any("input_layernorm" in k and k.startswith("layers.0.") for k in w)
    head = lossless(tiny_target, out / "draft", TreeConfig(3, 3, 8))
    assert type(head).__name__ == "Eagle2Head" and head.fc.bias is None


def test_eagle_noise_is_uniform_seeded_and_on_the_inputs_only(tiny_target, prepared, tmp_path):
    """The EAGLE paper's U(-a, a) on the features the head reads: bounded, centred, the same for the same key
    (a resumed run draws what the whole run drew) and another for the next; no other head gets any."""
    from toolkit.train.config import TrainConfig
    from toolkit.train.objectives import OBJECTIVES

    feats = torch.zeros(4, 96, 64)
    cfg = TrainConfig(data="x", head="eagle")
    noisy = OBJECTIVES["eagle"].inputs(cfg, feats, 7)
    assert noisy.abs().max() <= 0.1 and abs(float(noisy.mean())) < 2e-3
    assert float(noisy.std()) == pytest.approx(0.1 / 3 ** 0.5, rel=0.02)  # a uniform's spread, not a normal's
    assert torch.equal(noisy, OBJECTIVES["eagle"].inputs(cfg, feats, 7))
    assert not torch.equal(noisy, OBJECTIVES["eagle"].inputs(cfg, feats, 8))
    clean = TrainConfig(data="x", head="eagle", feature_noise=0)
    assert OBJECTIVES["eagle"].inputs(clean, feats, 7) is feats
    for head in ("eagle3", "mtp"):
        assert OBJECTIVES[head].inputs(TrainConfig(data="x", head=head), feats, 7) is feats
    # in training: the noise changes what the head learns, and a run resumed halfway draws the same noise
    steps = ["ttt_steps=1", "eval_samples=0", "save_every=2"]
    assert train("eagle", tiny_target, prepared, tmp_path / "whole", "max_steps=4", *steps) == 0
    assert train("eagle", tiny_target, prepared, tmp_path / "off", "max_steps=4", "feature_noise=0", *steps) == 0
    shutil.copytree(tmp_path / "whole", tmp_path / "cut")  # the run as it stood at its step-2 checkpoint
    shutil.rmtree(tmp_path / "cut/checkpoint-4")
    (tmp_path / "cut/metrics.jsonl").write_text("")
    assert main(["train", "--model", str(tiny_target), "--data", str(prepared), "--output-dir", str(tmp_path / "cut"),
                 "head=eagle", *COMMON, "max_steps=4", *steps, "--resume"]) == 0
    whole, off, cut = ({r["step"]: r["loss"] for r in records(tmp_path / run)} for run in ("whole", "off", "cut"))
    assert whole[1] != off[1] and sorted(cut) == [3, 4] and all(cut[s] == whole[s] for s in cut), (whole, cut, off)
    assert json.loads((tmp_path / "whole/train_config.json").read_text())["feature_noise"] == 0.1

# What picks the model class (read from their sources): SGLang's ModelRegistry.resolve_model_cls and vLLM's
# _ModelRegistry.resolve_model_cls both take the first name of `architectures` they register; before that
# vLLM's EAGLEConfig(method="eagle") prefixes "Eagle" to each name that does not start with it.
SGLANG_DRAFTS = {"LlamaForCausalLMEagle", "LlamaForCausalLMEagle3", "MiMoMTP", "DeepseekV3ForCausalLMNextN"}
VLLM_DRAFTS = {"EagleLlamaForCausalLM", "Eagle3LlamaForCausalLM", "LlamaForCausalLMEagle3", "MiMoMTPModel",
               "DeepSeekMTPModel"}


def first_registered(names, registered):
    return next((n for n in names if n in registered), None)


def sglang_draft_class(names):
    """SGLang's ModelConfig(is_draft_model=True) first renames a target's architecture to its MTP class."""
    first = {"MiMoForCausalLM": "MiMoMTP", "DeepseekV3ForCausalLM": "DeepseekV3ForCausalLMNextN"}.get(names[0])
    return first_registered([first or names[0], *names[1:]], SGLANG_DRAFTS)


def vllm_mtp_class(names):
    """vLLM's SpeculativeConfig.hf_config_override (an MTP draft) replaces MiMo's architecture by MiMoMTPModel."""
    return first_registered(["MiMoMTPModel"] if names[0] == "MiMoForCausalLM" else names, VLLM_DRAFTS)


def test_the_server_class_models_tell_the_mtp_names_apart():
    """The old export name (MiMoMTP) reached SGLang's class but no vLLM class: the models above must say so."""
    assert sglang_draft_class(["MiMoMTP"]) == "MiMoMTP" and vllm_mtp_class(["MiMoMTP"]) is None
    assert sglang_draft_class(["LlamaForCausalLM"]) is None and vllm_mtp_class(["LlamaForCausalLM"]) is None


def test_an_eagle_head_with_an_fc_bias_keeps_it_and_is_not_named_for_vllm(tiny_target, prepared, tmp_path, capsys):
    """vLLM's EagleLlamaForCausalLM builds fc without a bias and would drop a trained one: such a folder names
    only SGLang's class, so vLLM refuses it instead of serving another head. Without one, both pick a class."""
    for fc_bias in (True, False):
        out = tmp_path / str(fc_bias)
        assert train("eagle", tiny_target, prepared, out, "max_steps=2", "ttt_steps=1", "save_every=2",
                     "eval_samples=0", f"fc_bias={fc_bias}") == 0
        w = load_file(str(out / "draft/model.safetensors"))
        names = json.loads((out / "draft/config.json").read_text())["architectures"]
        assert bool(w["fc.bias"].any()) == fc_bias
        assert first_registered(names, SGLANG_DRAFTS) == "LlamaForCausalLMEagle"
        vllm_names = [n if n.startswith("Eagle") else f"Eagle{n}" for n in names]
        assert first_registered(vllm_names, VLLM_DRAFTS) == (None if fc_bias else "EagleLlamaForCausalLM")
        target = load_target(tiny_target)
        assert (load_draft(str(out / "draft"), target, None).fc.bias is not None) == fc_bias
    # training on from the head with a bias needs the setting that fits it, and the refusal says which
    capsys.readouterr()
    assert train("eagle", tiny_target, prepared, tmp_path / "on", "max_steps=1", "eval_samples=0",
                 f"init_from={tmp_path / 'True' / 'draft'}") == 2
    assert "the draft's fc has a bias: train on from it with fc_bias=true" in capsys.readouterr().err


@pytest.mark.parametrize("head", ["mtp", "eagle"])
def test_offline_shards_give_the_online_loss(tiny_target, prepared, tmp_path, head):
    shards = tmp_path / "hidden"
    assert main(["dump-hidden-states", "--model", str(tiny_target), "--data", str(prepared), "--out", str(shards),
                 "--max-len", "96", "--dtype", "float32"]) == 0
    assert train(head, tiny_target, prepared, tmp_path / "on", "max_steps=3", "ttt_steps=2") == 0
    assert train(head, tiny_target, prepared, tmp_path / "off", "max_steps=3", "ttt_steps=2",
                 f"hidden_states={shards}") == 0
    on = {r["step"]: r["loss"] for r in records(tmp_path / "on")}
    off = {r["step"]: r["loss"] for r in records(tmp_path / "off")}
    assert all(abs(on[s] - off[s]) <= 1e-5 * abs(on[s]) for s in on), (on, off)


@pytest.mark.parametrize("head", ["mtp", "eagle"])
def test_a_checkpoint_without_the_frozen_lm_head_and_embedding_resumes_exactly(tiny_target, prepared, tmp_path, head):
    """Checkpoints keep what training changes: the target's lm_head and embedding (V x H each, 2 GB of a Llama-3-8B
    head's checkpoint) come from the target at the resume, which continues the uninterrupted losses."""
    whole, part = tmp_path / "whole", tmp_path / "part"
    steps = ["ttt_steps=2", "eval_samples=0", "schedule_steps=4"]
    assert train(head, tiny_target, prepared, whole, "max_steps=4", "save_every=2", *steps) == 0
    assert train(head, tiny_target, prepared, part, "max_steps=2", "save_every=2", *steps) == 0
    saved = load_file(str(part / "checkpoint-2/model.safetensors"))
    assert not {k for k in saved if k.endswith(("lm_head.weight", "embed.weight"))}, sorted(saved)
    assert any(k.startswith("head.") for k in saved)
    assert main(["train", "--model", str(tiny_target), "--data", str(prepared), "--output-dir", str(part),
                 f"head={head}", *COMMON, "max_steps=4", "save_every=2", *steps, "--resume"]) == 0
    a = {r["step"]: r["loss"] for r in records(whole)}
    b = {r["step"]: r["loss"] for r in records(part)}
    assert all(abs(a[s] - b[s]) <= 1e-5 * abs(a[s]) for s in (3, 4)), (a, b)
    wa, wb = (load_file(str(d / "draft/model.safetensors")) for d in (whole, part))
    assert set(wa) == set(wb) and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_entry_scripts_refuse_a_recipe_for_another_head(tiny_target, prepared, tmp_path):
    cmd = [sys.executable, str(ROOT / "toolkit/train/eagle3.py"), "--model", str(tiny_target), "--data",
           str(prepared), "--output-dir", str(tmp_path / "x"), "head=mtp", "max_steps=1"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 2 and "launch toolkit/train/mtp.py" in done.stderr
    assert train("mtp", tiny_target, prepared, tmp_path / "y", "num_layers=2") == 2
    assert train("eagle", tiny_target, prepared, tmp_path / "z", "token_map=x.safetensors") == 2


@pytest.mark.parametrize("head", ["mtp", "eagle"])
def test_init_from_a_trained_draft_starts_from_its_weights(tiny_target, prepared, tmp_path, head):
    first = tmp_path / "first"
    assert train(head, tiny_target, prepared, first, "max_steps=6", "ttt_steps=2", "save_every=6",
                 "eval_samples=0") == 0
    for name, extra in (("again", [f"init_from={first / 'draft'}"]), ("fresh", [])):
        assert train(head, tiny_target, prepared, tmp_path / name, "max_steps=1", "lr=1e-12", "ttt_steps=2",
                     "save_every=1", "eval_samples=0", *extra) == 0
    wa, wb, wf = (load_file(str(tmp_path / d / "draft/model.safetensors")) for d in ("first", "again", "fresh"))
    assert set(wa) == set(wb) and all(torch.allclose(wa[k].float(), wb[k].float(), atol=1e-2) for k in wa)
    assert not all(torch.allclose(wa[k].float(), wf[k].float(), atol=1e-2) for k in wa)
    # an EAGLE-3 recipe refuses this draft, naming both kinds
    assert main(["train", "--model", str(tiny_target), "--data", str(prepared), "--output-dir",
                 str(tmp_path / "x"), *COMMON, f"init_from={first / 'draft'}"]) == 2


@pytest.mark.parametrize("what,text", [
    ({"attention_bias": True, "qkv_bias": True}, "an o_proj bias, which SGLang's MiMoMTP block lacks: the exported "
     "head serves here, but SGLang would drop that bias without a word"),
    ({"model_type": "qwen3", "qk_norm": True}, "q/k norms (Qwen3), which SGLang's MiMoMTP block lacks: the exported "
     "head will serve only in this toolkit; SGLang refuses to load the folder"),
    ({"model_type": "phi3", "rotary_dim": 6}, "rotates 6 of each head's 8 dims (partial_rotary_factor), as the MTP "
     "block will; SGLang's MiMoMTP block (Qwen2's attention) rotates all of them"), ({}, None)])
def test_mtp_training_warns_where_sglang_would_not_serve_the_head_as_trained(capsys, what, text):
    """SGLang's MiMoMTP block is Qwen2's: its load_weights skips an exported o_proj bias (Llama attention_bias)
    without a word, raises a KeyError on q/k norms (Qwen3), refusing the folder, and rotates every dim of a head
    that the target rotates in part (Phi-4-mini); training says which before it starts; a plain Llama target
    trains quietly."""
    from types import SimpleNamespace

    from toolkit.infer.config import ModelConfig
    from toolkit.train.objectives import OBJECTIVES

    c = ModelConfig(**{"model_type": "llama", "vocab_size": 40, "hidden_size": 16, "intermediate_size": 24,
                       "num_layers": 2, "num_heads": 2, "num_kv_heads": 2, "head_dim": 8, **what})
    head = OBJECTIVES["mtp"].build(SimpleNamespace(seed=0, init_block="random"), c, None, None,
                                   {"lm_head.weight": torch.randn(40, 16)}, None)
    err = capsys.readouterr().err
    assert text in err if text else err == ""
    assert head.block.self_attn.o_proj.bias is not None if what.get("attention_bias") else True
