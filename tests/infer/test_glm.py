"""GLM-4.5 / 4.6 targets (`glm4_moe`: RoPE on part of each head, q/k/v biases, optional q/k norms, DeepSeek-style
MoE) in the engine, against transformers on tiny random configs: logits and hidden states match, greedy decoding
equals transformers' generate, an EAGLE-3 draft is lossless over them, and the NextN MTP layer GLM checkpoints
ship loads with every weight mapped and drafts losslessly."""
import json

import pytest
import torch
from hf_reference import assert_forward_matches, assert_greedy_matches

from toolkit.infer.config import ConfigError, ModelConfig
from toolkit.infer.draft_folder import load_draft
from toolkit.infer.engine import Engine
from toolkit.infer.loading import load_target
from toolkit.infer.mtp import MTPHead
from toolkit.infer.sampling import SamplingParams
from toolkit.infer.tree import TreeConfig

V, H, LAYERS = 211, 64, 3
BASE = dict(vocab_size=V, hidden_size=H, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=LAYERS,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, n_routed_experts=8, num_experts_per_tok=2,
            n_group=2, topk_group=1, first_k_dense_replace=1, n_shared_experts=1, routed_scaling_factor=1.5,
            max_position_embeddings=256, bos_token_id=0, eos_token_id=1)
VARIANTS = {
    "bias+qk_norm+half_rope": dict(attention_bias=True, use_qk_norm=True),
    "quarter_rope+yarn": dict(attention_bias=False, use_qk_norm=False, rope_parameters={
        "rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 128, "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25}),
}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def glm(request, tmp_path_factory):
    """(folder, transformers model): a tiny random GLM-4.5 saved by transformers."""
    from transformers import AutoModelForCausalLM, Glm4MoeConfig

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Glm4MoeConfig(**BASE, **VARIANTS[request.param]),
                                             dtype=torch.float32).eval()
    with torch.no_grad():  # random norms, biases and routing, so a swapped or skipped weight shows
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.normal_(1.0 if "norm" in name else 0.0, 0.2)
        for layer in model.model.layers[1:]:
            layer.mlp.gate.weight.normal_(0.0, 0.5)
            layer.mlp.gate.e_score_correction_bias.normal_(0.0, 0.3)
        model.lm_head.weight.normal_(0.0, 1.0)
    folder = tmp_path_factory.mktemp("glm")
    model.save_pretrained(folder)
    return folder, model


def test_config_reads_partial_rope_biases_and_norms():
    from transformers import Glm4MoeConfig

    c = ModelConfig.from_hf(Glm4MoeConfig(**BASE, **VARIANTS["bias+qk_norm+half_rope"]).to_dict())
    assert (c.rotary_dim, c.rope_dim, c.qkv_bias, c.attention_bias, c.qk_norm) == (8, 8, True, False, True)
    assert c.moe.scoring == "sigmoid" and c.moe.dense_layers == (0,) and c.moe.shared_size == 32
    assert len(c.inv_freq()) == 4
    # the 4.x spelling: partial_rotary_factor at the top level; absent, GLM's default of 0.5
    old = {"model_type": "glm4_moe", **BASE, "partial_rotary_factor": 0.25, "rope_theta": 1e6}
    assert ModelConfig.from_hf(old).rotary_dim == 4
    assert ModelConfig.from_hf({"model_type": "glm4_moe", **BASE}).rotary_dim == 8
    assert ModelConfig.from_hf({"model_type": "glm4_moe", **BASE, "partial_rotary_factor": 1.0}).rotary_dim is None
    with pytest.raises(ConfigError, match="partial_rotary_factor"):
        ModelConfig.from_hf({"model_type": "glm4_moe", **BASE, "partial_rotary_factor": 0})


def test_logits_and_hidden_states_match_transformers(glm):
    folder, hf = glm
    assert_forward_matches(load_target(folder), hf, 29, [0, 1, -1])


def test_greedy_decoding_equals_transformers_generate_and_an_eagle3_draft_is_lossless(glm):
    folder, hf = glm
    head, _ = assert_greedy_matches(load_target(folder), hf, 12)
    assert head.config.rotary_dim is None  # an EAGLE-3 head is a plain Llama layer, rotating whole heads


def test_the_shipped_nextn_layer_maps_every_weight_and_drafts_losslessly(glm, tmp_path):
    from test_deepseek import with_mtp_layer  # GLM-4.5 ships its NextN layer in DeepSeek-V3's layout

    folder, _ = glm
    assert json.loads((folder / "config.json").read_text())["num_nextn_predict_layers"] == 1
    mtp = with_mtp_layer(folder, tmp_path / "t")
    target = load_target(tmp_path / "t")
    head = load_draft(str(tmp_path / "t"), target, None)
    assert isinstance(head, MTPHead) and type(head.block.mlp).__name__ == "MoE"
    assert head.config.rotary_dim == target.config.rotary_dim  # the block is the target's kind, partial RoPE too
    p = f"model.layers.{LAYERS}."
    for k, v in head.block.state_dict().items():
        assert torch.equal(v, mtp[p + k]), k
    prompts, sp = [[5, 17, 33, 8, 61], [9, 4, 70]], SamplingParams(max_new_tokens=16)
    want = [r.tokens for r in Engine(target, max_len=64, max_batch=2).generate_batch(prompts, sp)]
    got = Engine(target, head, TreeConfig(2, 1, 3), max_len=64, max_batch=2).generate_batch(prompts, sp)
    assert [r.tokens for r in got] == want


def test_a_bf16_glm_target_keeps_its_router_in_fp32(glm, tmp_path):
    folder, hf = glm
    target = load_target(folder, dtype=torch.bfloat16)
    gate = target.layers[1].mlp.gate
    assert gate.weight.dtype == gate.e_score_correction_bias.dtype == torch.float32
    assert torch.equal(gate.e_score_correction_bias, hf.model.layers[1].mlp.gate.e_score_correction_bias)
    assert target.layers[1].mlp.experts[0].gate_proj.weight.dtype == torch.bfloat16
