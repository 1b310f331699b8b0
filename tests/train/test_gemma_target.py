"""A Gemma 3 target through the whole pipeline: EAGLE-3 training online lowers the loss and its evaluation runs the
engine on the Gemma target; `toolkit bench` serves the exported head over it with greedy text identical to plain
decoding, and `--compile` is refused by name."""
from __future__ import annotations

import subprocess

import pytest
import torch
from test_moe_target import assert_bench_lossless, bench_command, train_eagle3


@pytest.fixture(scope="module")
def gemma_target(tiny_target, tmp_path_factory, peaked):
    """A random 6-layer Gemma 3 (window 16 on five of six layers, its own RoPE base there) with tiny_target's
    tokenizer."""
    from transformers import AutoModelForCausalLM, Gemma3TextConfig

    folder = tmp_path_factory.mktemp("gemma-target")
    cfg = Gemma3TextConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
                           sliding_window=16, max_position_embeddings=1024, bos_token_id=1, eos_token_id=2,
                           pad_token_id=0, tie_word_embeddings=False)
    torch.manual_seed(0)
    return peaked(AutoModelForCausalLM.from_config(cfg), folder, tiny_target)


def test_eagle3_trains_on_a_gemma_target_and_bench_serves_it_losslessly(gemma_target, prepared, tmp_path):
    out = tmp_path / "run"
    cfg = train_eagle3(gemma_target, prepared, out)
    assert cfg["rope_theta"] == 1e6  # the full-attention layers' base (transformers' Gemma 3 default)
    bench = bench_command(out / "draft", tmp_path, 24)
    assert_bench_lossless(bench, tmp_path)
    refused = subprocess.run(bench + ["--compile"], capture_output=True, text=True)
    assert refused.returncode != 0 and "does not cover Gemma targets" in refused.stderr
    assert "Traceback" not in refused.stderr
