"""Gemma configs at settings no release uses, read as transformers runs them (an audit's cases): logits of tiny
random models built from the same config.json match transformers past the window; what transformers cannot run
either is refused by name."""
import json

import pytest
import torch
from hf_reference import assert_forward_matches

from toolkit.infer.config import ConfigError, ModelConfig
from toolkit.infer.loading import load_target

W = 8
TEXT = dict(vocab_size=173, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, max_position_embeddings=256, bos_token_id=0, eos_token_id=1, pad_token_id=0,
            sliding_window=W, query_pre_attn_scalar=24)
G2 = dict(TEXT, model_type="gemma2", architectures=["Gemma2ForCausalLM"], num_hidden_layers=6)
G3 = dict(TEXT, model_type="gemma3_text", architectures=["Gemma3ForCausalLM"], num_hidden_layers=6,
          sliding_window_pattern=3)
NESTED = {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
          "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
CASES = {
    # Gemma2Config always alternates: sliding_window_pattern is Gemma 3's key only
    "gemma2-pattern-key": G2 | dict(sliding_window_pattern=3),
    # Gemma3Attention keeps attn_logit_softcapping and never applies it
    "gemma3-attn-softcap": G3 | dict(attn_logit_softcapping=2.0, final_logit_softcapping=3.0),
    # a 4.x rope_scaling beside 5.x nested rope_parameters: merged into the full layers'
    "gemma3-nested-plus-rope-scaling": G3 | dict(rope_parameters=NESTED,
                                                 rope_scaling={"rope_type": "linear", "factor": 8.0}),
    # per layer type, yarn takes original_max_position_embeddings from its own dict, not the top level
    "gemma3-yarn-top-level-original": G3 | dict(original_max_position_embeddings=32, rope_parameters={
        **NESTED, "full_attention": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}}),
    # the multimodal class never soft-caps its logits (its text class does)
    "gemma3-multimodal-final-softcap": dict(
        model_type="gemma3", architectures=["Gemma3ForConditionalGeneration"], mm_tokens_per_image=4,
        image_token_index=170, boi_token_index=171, eoi_token_index=172,
        text_config={k: v for k, v in G3.items() if k != "architectures"} | dict(final_logit_softcapping=3.0),
        vision_config=dict(model_type="siglip_vision_model", hidden_size=16, intermediate_size=32,
                           num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14)),
}


def build(cfg: dict, folder):
    """A random transformers model read from `cfg` written as config.json (norms away from 0, a peaked readout),
    saved with that same config.json; returns the model as transformers runs it."""
    import transformers

    (folder / "config.json").write_text(json.dumps(cfg))
    multimodal = cfg["model_type"] == "gemma3"
    cls = transformers.Gemma3ForConditionalGeneration if multimodal else transformers.AutoModelForCausalLM
    torch.manual_seed(0)
    config = transformers.AutoConfig.from_pretrained(folder)
    model = (cls(config) if multimodal else cls.from_config(config, dtype=torch.float32)).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0, 0.3)
        model.get_input_embeddings().weight.normal_(0.0, 0.2)
    model.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(cfg))
    return cls.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers_at_settings_no_release_uses(case, tmp_path):
    hf = build(CASES[case], tmp_path)
    ours = load_target(tmp_path)
    if case == "gemma3-multimodal-final-softcap":  # its forward wants pixel inputs' keys: compare its text model
        assert ours.config.gemma.final_softcap is None
        with torch.no_grad():
            ids = torch.randint(0, 173, (2, 3 * W + 5), generator=torch.Generator().manual_seed(1))
            want = hf(input_ids=ids).logits
            assert (ours(ids)[0] - want).abs().max() <= 1e-4
        return
    assert_forward_matches(ours, hf, 3 * W + 5, [0, 2, -1])


def test_the_read_settings():
    assert ModelConfig.from_hf(CASES["gemma2-pattern-key"]).full_layers == (1, 3, 5)
    c = ModelConfig.from_hf(CASES["gemma3-attn-softcap"])
    assert c.gemma.attn_softcap is None and c.gemma.final_softcap == 3.0
    c = ModelConfig.from_hf(CASES["gemma3-nested-plus-rope-scaling"])
    assert c.rope_theta == 1e6 and c.rope_scaling == {"rope_type": "linear", "factor": 8.0}
    c = ModelConfig.from_hf(CASES["gemma3-yarn-top-level-original"])
    assert c.rope_scaling["original_max_position_embeddings"] == 256


@pytest.mark.parametrize("bad, named", [
    # transformers ignores a flat rope_parameters on Gemma 3 (default RoPE, theta 1e6): never what was meant
    (G3 | dict(rope_parameters={"rope_type": "linear", "factor": 8.0, "rope_theta": 5e5}), "not per layer type"),
    # transformers fails at its first forward on both
    (G3 | dict(sliding_window=None), "sliding_window is null but some layers are sliding_attention"),
    (G2 | dict(sliding_window=None), "sliding_window is null"),
    ({"model_type": "llama4_text", "attention_chunk_size": None, "num_hidden_layers": 4,
      "layer_types": ["chunked_attention", "full_attention"] * 2}, "attention_chunk_size is null but layer_types"),
])
def test_what_transformers_cannot_run_either_is_refused_by_name(bad, named):
    with pytest.raises(ConfigError, match=named):
        ModelConfig.from_hf(bad)
