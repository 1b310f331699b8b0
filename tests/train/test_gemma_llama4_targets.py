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
