"""Phi-3 / Phi-4 targets (`phi3`: fused qkv_proj and gate_up_proj on disk, partial RoPE as Phi-4-mini's, longrope)
in the engine, against transformers on tiny random configs: logits and hidden states match, greedy decoding
equals transformers' generate and an EAGLE-3 draft over them is lossless; old rope type names and fused tensors
of the wrong size are handled as transformers would."""
import json

import pytest
import torch
from hf_reference import assert_forward_matches, assert_greedy_matches
from safetensors.torch import load_file, save_file

from toolkit.infer.config import ConfigError, ModelConfig
from toolkit.infer.drafts import random_head
from toolkit.infer.loading import load_target

V = 211
BASE = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, bos_token_id=0, eos_token_id=1, pad_token_id=0)
HALF = 8  # longrope factors: one per rotated frequency (head_dim 16 x 0.75 = 12 dims -> 6; full -> 8)
VARIANTS = {
    "phi3-full-rope": dict(),
    # Phi-4-mini's shape: tied embeddings, 3/4 of each head rotated, longrope with short and long factors
    "phi4-mini-partial-longrope": dict(tie_word_embeddings=True, original_max_position_embeddings=128, rope_parameters={
        "rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
        "short_factor": [1.0 + 0.1 * i for i in range(6)], "long_factor": [2.0 + 0.5 * i for i in range(6)]}),
}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def phi3(request, tmp_path_factory):
    from transformers import AutoModelForCausalLM, Phi3Config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Phi3Config(**BASE, **VARIANTS[request.param]),
                                             dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(1.0, 0.2)
        model.lm_head.weight.normal_(0.0, 1.0)
    folder = tmp_path_factory.mktemp("phi3")
    model.save_pretrained(folder)
    return request.param, folder, model


def test_logits_and_hidden_states_match_transformers(phi3):
    case, folder, hf = phi3
    with torch.no_grad():
        w = load_file(str(folder / "model.safetensors"))
        assert "model.layers.0.self_attn.qkv_proj.weight" in w and "model.layers.0.mlp.gate_up_proj.weight" in w
    ours = load_target(folder)
    assert ours.config.rotary_dim == (12 if "partial" in case else None)
    assert_forward_matches(ours, hf, 37, [0, 1, 2])


def test_greedy_decoding_equals_transformers_generate_and_an_eagle3_draft_is_lossless(phi3):
    _, folder, hf = phi3
    assert_greedy_matches(load_target(folder), hf, 14)


def test_an_eagle3_head_of_a_partial_rope_target_rotates_whole_heads_and_round_trips(phi3, tmp_path):
    """As SpecForge's Phi-4-mini draft config: a Llama layer with unscaled RoPE of the target's theta over whole
    heads; written so, and read back the same."""
    from toolkit.infer.drafts import load_eagle3, save_eagle3

    case, folder, _ = phi3
    target = load_target(folder)
    head = random_head(target.config, list(range(0, V, 3)))
    assert head.config.rotary_dim is None and len(head.inv_freq) == 8
    assert head.config.rope_scaling == ({} if "partial" in case else target.config.rope_scaling)
    hf_cfg = json.loads((folder / "config.json").read_text())
    save_eagle3(head, tmp_path, hf_cfg, str(folder), "0" * 16)
    cfg = json.loads((tmp_path / "config.json").read_text())
    if "partial" in case:
        assert cfg["rope_parameters"] == {"rope_theta": 10000.0, "rope_type": "default"} and "rope_scaling" not in cfg
    back = load_eagle3(tmp_path, target.config)
    assert torch.equal(back.inv_freq, head.inv_freq) and back.config.rope_scaling_or_default["rope_type"] == \
        head.config.rope_scaling_or_default["rope_type"]


def _cfg(**extra):
    return ModelConfig.from_hf({"model_type": "phi3", **BASE, **extra})


def test_config_reads_old_rope_names_windows_and_defaults():
    for old in ("su", "yarn"):  # Phi-3-mini-128k's config: rope_scaling type "su" is longrope
        c = _cfg(rope_scaling={"type": old, "short_factor": [1.0] * HALF, "long_factor": [2.0] * HALF},
                 original_max_position_embeddings=128)
        assert c.rope_scaling["rope_type"] == "longrope"
    c = _cfg(num_key_value_heads=None)
    assert (c.num_kv_heads, c.rms_norm_eps, c.sliding_window, c.rotary_dim) == (4, 1e-5, None, None)
    assert _cfg(sliding_window=96).sliding_window == 96  # Phi-3-mini-4k: every layer slides
    with pytest.raises(ConfigError, match="partial_rotary_factor"):
        _cfg(partial_rotary_factor=1.5)


def test_a_fused_tensor_of_the_wrong_size_is_refused_by_name(phi3, tmp_path):
    _, folder, _ = phi3
    w = load_file(str(folder / "model.safetensors"))
    w["model.layers.1.mlp.gate_up_proj.weight"] = w["model.layers.1.mlp.gate_up_proj.weight"][:-2]
    save_file(w, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(json.loads((folder / "config.json").read_text())))
    with pytest.raises(ValueError, match=r"layers\.1\.mlp\.gate_up_proj\.weight: 190 rows.*gate_proj 96 \+ up_proj 96"):
        load_target(tmp_path)
