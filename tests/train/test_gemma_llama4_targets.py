"""Gemma 3 and Llama 4 targets through the whole pipeline: EAGLE-3 training online lowers the loss and its evaluation
runs the engine on the target; `toolkit bench` serves the exported head over it with greedy text identical to plain
decoding, and `--compile` (which runs Llama's layer pieces) is refused by name."""
from __future__ import annotations

import subprocess

import pytest
import torch
from test_moe_target import assert_bench_lossless, bench_command, train_eagle3

SHAPE = dict(vocab_size=49152, hidden_size=64, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, max_position_embeddings=1024, bos_token_id=1, eos_token_id=2, pad_token_id=0,
             tie_word_embeddings=False)
TARGETS = {
    # window 16 on five of six layers, their own RoPE base there; full layers at base 1e6
    "gemma3_text": ("Gemma3TextConfig", dict(intermediate_size=128, query_pre_attn_scalar=16, sliding_window=16),
                    1e6),
    # chunks of 16 on the RoPE layers, every 4th layer NoPE, MoE (4 experts, top 1) on every 2nd layer
    "llama4_text": ("Llama4TextConfig", dict(intermediate_size=48, intermediate_size_mlp=128, attention_chunk_size=16,
                                             num_local_experts=4, interleave_moe_layer_step=2, floor_scale=8,
                                             rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
                    500000.0),
}


@pytest.fixture(scope="module", params=sorted(TARGETS))
def target(request, tiny_target, tmp_path_factory, peaked):
    """(model_type, RoPE base a head's config.json takes, folder): a random target with tiny_target's tokenizer."""
    import transformers

    cls, extra, theta = TARGETS[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(getattr(transformers, cls)(**SHAPE, **extra))
    return request.param, theta, peaked(model, folder, tiny_target)


def test_eagle3_trains_on_the_target_and_bench_serves_it_losslessly(target, prepared, tmp_path):
    kind, theta, folder = target
    out = tmp_path / "run"
    cfg = train_eagle3(folder, prepared, out)
    assert cfg["rope_theta"] == theta  # Gemma 3: its full-attention layers' base
    bench = bench_command(out / "draft", tmp_path, 24)
    assert_bench_lossless(bench, tmp_path)
    refused = subprocess.run(bench + ["--compile"], capture_output=True, text=True)
    assert refused.returncode != 0 and f"does not cover {kind} targets" in refused.stderr
    assert "Traceback" not in refused.stderr


@pytest.fixture(scope="module")
def gemma2_target(tiny_target, tmp_path_factory, peaked):
    """A random 4-layer Gemma 2 whose logits the final soft-cap (2.0, tight) bends a lot."""
    from transformers import AutoModelForCausalLM, Gemma2Config

    folder = tmp_path_factory.mktemp("gemma2-target")
    torch.manual_seed(0)
    cfg = Gemma2Config(**{**SHAPE, "num_hidden_layers": 4}, intermediate_size=128, query_pre_attn_scalar=16,
                       sliding_window=16, final_logit_softcapping=2.0)
    return peaked(AutoModelForCausalLM.from_config(cfg), folder, tiny_target)


def test_offline_features_give_the_online_loss_with_gemma_2s_soft_capped_logits(gemma2_target, prepared, tmp_path):
    """Offline training computes the target's logits from the dumped final state and its lm_head: capped as the
    target's readout caps them, its losses are the online run's."""
    import json

    from test_eagle3 import COMMON, losses

    from toolkit.cli import main

    shards = tmp_path / "hidden"
    assert main(["dump-hidden-states", "--model", str(gemma2_target), "--data", str(prepared), "--out", str(shards),
                 "--max-len", "96", "--dtype", "float32"]) == 0
    assert json.loads((shards / "index.json").read_text())["num_samples"] == 24
    for name, extra in (("on", []), ("off", [f"hidden_states={shards}"])):
        assert main(["train", "--model", str(gemma2_target), "--data", str(prepared), "--output-dir",
                     str(tmp_path / name), *COMMON, "max_steps=3", "save_every=3", *extra]) == 0
    on, off = losses(tmp_path / "on"), losses(tmp_path / "off")
    assert all(abs(on[s] - off[s]) <= 1e-5 * abs(on[s]) for s in on), (on, off)


def test_training_reads_a_multimodal_checkpoints_text_model(target, tmp_path):
    """The embedding, lm_head and a layer (MTP's start) of a multimodal checkpoint's text model (language_model.*
    names, a vision tower beside them) are the text-only checkpoint's."""
    import json

    from safetensors.torch import load_file, save_file

    from toolkit.infer.config import ModelConfig
    from toolkit.train.head import target_layer, target_tensors

    kind, _, folder = target
    text = json.loads((folder / "config.json").read_text())
    mm = tmp_path / "mm"
    mm.mkdir()
    (mm / "config.json").write_text(json.dumps({"model_type": kind.removesuffix("_text"), "text_config": text}))
    w = {"language_model." + k: v for k, v in load_file(str(folder / "model.safetensors")).items()}
    w["vision_tower.x.weight"] = torch.zeros(2, 2)
    save_file(w, str(mm / "model.safetensors"))
    names = ["embed_tokens.weight", "lm_head.weight"]
    a, b = target_tensors(mm, names), target_tensors(folder, names)
    assert a.keys() == b.keys() == set(names) and all(torch.equal(a[k], b[k]) for k in names)
    c = ModelConfig.from_folder(folder)
    a, b = target_layer(mm, 5, c), target_layer(folder, 5, c)
    assert a.keys() == b.keys() and a and all(torch.equal(a[k], b[k]) for k in a)
