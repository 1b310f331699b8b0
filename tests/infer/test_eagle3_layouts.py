"""EAGLE-3 heads in the layouts released heads ship in (toolkit/infer/eagle3_config.py): speculators folders (Red
Hat's heads: the layer config nested and saved as a diff, `layers.0.*`, norm_before_residual) and vLLM's
`Eagle3LlamaForCausalLM` ones with norm_before_fc, drafted as the model they were trained as computes them: the
reference below is transformers' own Llama decoder layer with speculators' first-layer rule, written
independently of the engine's head."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from toolkit.infer.config import ModelConfig
from toolkit.infer.draft_folder import draft_kind, recorded_target
from toolkit.infer.drafts import load_eagle3, save_eagle3

TARGET = ModelConfig(model_type="llama", vocab_size=300, hidden_size=64, intermediate_size=96, num_layers=8,
                     num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=4096)
H, D, N = 64, 16, 100
# what transformers' LlamaConfig.to_diff_dict leaves of the layer's config: rope_theta 10000, rms_norm_eps 1e-6,
# hidden_act silu and head_dim (hidden / heads) are LlamaConfig's defaults, so absent
LAYER = {"model_type": "llama", "hidden_size": H, "intermediate_size": 96, "num_attention_heads": 4,
         "num_key_value_heads": 2, "num_hidden_layers": 1, "vocab_size": 300, "max_position_embeddings": 4096}


def weights(norm_before_fc: bool, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g) * 0.05
    ones = lambda n: 1 + torch.randn(n, generator=g) * 0.2  # norm weights that matter
    ids = torch.arange(0, 300, 3)[:N]
    w = {"fc.weight": r(H, 3 * H), "norm.weight": ones(H), "lm_head.weight": r(N, H) * 20,
         "layers.0.input_layernorm.weight": ones(H), "layers.0.hidden_norm.weight": ones(H),
         "layers.0.post_attention_layernorm.weight": ones(H),
         "layers.0.self_attn.q_proj.weight": r(4 * D, 2 * H), "layers.0.self_attn.k_proj.weight": r(2 * D, 2 * H),
         "layers.0.self_attn.v_proj.weight": r(2 * D, 2 * H), "layers.0.self_attn.o_proj.weight": r(H, 4 * D),
         "layers.0.mlp.gate_proj.weight": r(96, H), "layers.0.mlp.up_proj.weight": r(96, H),
         "layers.0.mlp.down_proj.weight": r(H, 96), "embed_tokens.weight": r(300, H),
         "d2t": ids - torch.arange(N), "t2d": torch.zeros(300, dtype=torch.bool).index_fill_(0, ids, True)}
    if norm_before_fc:
        w["input_norm.weight"] = ones(3 * H)
    return w


def speculators_folder(folder, norm_before_residual=True, norm_before_fc=False, **top):
    """A speculators eagle3 folder as its Eagle3SpeculatorConfig saves one."""
    w = weights(norm_before_fc)
    cfg = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "draft_vocab_size": N,
           "norm_before_residual": norm_before_residual, "norm_before_fc": norm_before_fc, "target_hidden_size": None,
           "eagle_aux_hidden_state_layer_ids": [2, 4, 5], "transformer_layer_config": LAYER,
           "speculators_config": {"algorithm": "eagle3", "proposal_methods": [{"speculative_tokens": 3}],
                                  "verifier": {"name_or_path": "org/target-model"}}, **top}
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file(w, str(folder / "model.safetensors"))
    return w


@torch.no_grad()
def reference(w, emb, aux, norm_before_residual, norm_before_fc):
    """speculators' Eagle3 first layer on transformers' LlamaDecoderLayer, then norm and lm_head: log-probs."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

    c = LlamaConfig(**LAYER)
    c._attn_implementation = "sdpa"  # causal without a mask
    layer = LlamaDecoderLayer(c, 0)
    for name in ("q_proj", "k_proj", "v_proj"):
        setattr(layer.self_attn, name, nn.Linear(2 * H, getattr(layer.self_attn, name).out_features, bias=False))
    layer.hidden_norm = LlamaRMSNorm(H, eps=c.rms_norm_eps)
    layer.load_state_dict({k.removeprefix("layers.0."): v for k, v in w.items() if k.startswith("layers.0.")})
    if norm_before_fc:
        aux = _rms(aux, w["input_norm.weight"], c.rms_norm_eps)
    h = aux @ w["fc.weight"].T
    hn = layer.hidden_norm(h)
    residual = hn if norm_before_residual else h
    x = torch.cat([layer.input_layernorm(emb), hn], -1)
    pos = torch.arange(emb.shape[1])[None]
    a, _ = layer.self_attn(x, position_embeddings=LlamaRotaryEmbedding(c)(x, pos), attention_mask=None)
    h = residual + a
    h = h + layer.mlp(layer.post_attention_layernorm(h))
    return torch.log_softmax(_rms(h, w["norm.weight"], c.rms_norm_eps) @ w["lm_head.weight"].T, -1)


def _rms(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


@pytest.mark.parametrize("norm_before_residual, norm_before_fc", [(False, False), (True, False), (False, True),
                                                                   (True, True)])
def test_a_speculators_head_drafts_as_it_was_trained(tmp_path, norm_before_residual, norm_before_fc):
    w = speculators_folder(tmp_path, norm_before_residual, norm_before_fc)
    assert draft_kind(tmp_path) == "eagle3"
    head = load_eagle3(tmp_path, TARGET)
    assert head.aux_layers == [1, 3, 4] and head.norm_before_residual == norm_before_residual
    assert head.config.rope_theta == 10000.0 and head.config.head_dim == D  # LlamaConfig's defaults filled in
    emb, aux = torch.randn(1, 7, H), torch.randn(1, 7, 3 * H) * 3
    with torch.no_grad():
        got, _ = head(emb, aux, torch.arange(7)[None], head.new_cache(16))
    want = reference(w, emb, aux, norm_before_residual, norm_before_fc)
    assert (got - want).abs().max() < 1e-4
    # and reading a variant as the other would be wrong, so the test can tell them apart
    other = reference(w, emb, aux, not norm_before_residual, norm_before_fc)
    assert (other - want).abs().max() > 1e-2


def test_speculators_norm_before_residual_defaults_as_vllm_reads_it(tmp_path):
    """vLLM's speculators reader takes an absent norm_before_residual as true; a plain (vLLM / SGLang) config's
    absent one is false."""
    speculators_folder(tmp_path / "s")
    cfg = json.loads((tmp_path / "s" / "config.json").read_text())
    del cfg["norm_before_residual"]
    (tmp_path / "s" / "config.json").write_text(json.dumps(cfg))
    assert load_eagle3(tmp_path / "s", TARGET).norm_before_residual is True


def test_vllm_names_and_nvidia_norm_before_fc_in_eagle_config(tmp_path):
    w = weights(norm_before_fc=True)
    cfg = {**LAYER, "architectures": ["Eagle3LlamaForCausalLM"], "draft_vocab_size": N, "head_dim": D,
           "eagle_aux_hidden_state_layer_ids": [2, 4, 5], "eagle_config": {"norm_before_fc": True}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    save_file(w, str(tmp_path / "model.safetensors"))
    assert draft_kind(tmp_path) == "eagle3"
    head = load_eagle3(tmp_path, TARGET)
    assert head.input_norm is not None and head.norm_before_residual is False
    emb, aux = torch.randn(1, 5, H), torch.randn(1, 5, 3 * H) * 3
    with torch.no_grad():
        got, _ = head(emb, aux, torch.arange(5)[None], head.new_cache(8))
    assert (got - reference(w, emb, aux, False, True)).abs().max() < 1e-4


def test_a_variant_head_saves_and_loads_as_itself(tmp_path):
    """Trained on from a released head (init_from), the export keeps its variant where vLLM reads it."""
    speculators_folder(tmp_path / "in", norm_before_residual=True, norm_before_fc=True)
    head = load_eagle3(tmp_path / "in", TARGET)
    save_eagle3(head, tmp_path / "out", {"vocab_size": 300, "max_position_embeddings": 4096}, "tiny", "0" * 16)
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["norm_before_residual"] is True and cfg["norm_before_fc"] is True
    assert cfg["eagle_config"]["norm_before_fc"] is True
    back = load_eagle3(tmp_path / "out", TARGET)
    emb, aux = torch.randn(1, 5, H), torch.randn(1, 5, 3 * H)
    with torch.no_grad():
        a = head.to(torch.bfloat16).float()(emb, aux, torch.arange(5)[None], head.new_cache(8))[0]
        b = back(emb, aux, torch.arange(5)[None], back.new_cache(8))[0]
    assert torch.allclose(a, b, atol=1e-5)
    plain = load_eagle3(tmp_path / "in", TARGET)
    plain.norm_before_residual, plain.input_norm = False, None
    save_eagle3(plain, tmp_path / "plain", {"vocab_size": 300}, "tiny", "0" * 16)
    assert "norm_before_residual" not in json.loads((tmp_path / "plain" / "config.json").read_text())


def test_the_verifier_a_speculators_folder_names_is_its_target(tmp_path):
    speculators_folder(tmp_path)
    assert recorded_target(str(tmp_path)) == {"target": "org/target-model"}


@pytest.mark.parametrize("change, message", [
    ({"speculators_model_type": "eagle", "architectures": ["EagleSpeculator"]}, "speculators 'eagle' folder"),
    ({"speculators_model_type": "mtp", "architectures": ["MTPSpeculator"]}, "speculators 'mtp' folder"),
    ({"fc_norm": True}, "fc_norm: true"),
    ({"norm_output": True}, "norm_output: true"),
    ({"transformer_layer_config": {**LAYER, "model_type": "qwen3"}}, "model_type 'qwen3'"),
    ({"transformer_layer_config": None}, "needs a transformer_layer_config"),
])
def test_layouts_this_engine_does_not_serve_are_refused_by_name(tmp_path, change, message):
    speculators_folder(tmp_path, **change)
    with pytest.raises(ValueError, match=message):
        load_eagle3(tmp_path, TARGET) if draft_kind(tmp_path) == "eagle3" else None


def test_a_head_without_an_lm_head_reads_out_through_the_targets(tmp_path):
    """SGLang (draft_vocab_size null) and vLLM (no lm_head weight loaded) read such a head out through the target's
    lm_head; so does the engine. A draft vocabulary smaller than the target's cannot be."""
    w = weights(norm_before_fc=False)
    del w["lm_head.weight"], w["d2t"], w["t2d"]
    cfg = {**LAYER, "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": None, "head_dim": D,
           "eagle_aux_hidden_state_layer_ids": [2, 4, 5]}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    save_file(w, str(tmp_path / "model.safetensors"))
    target_head = torch.randn(300, H)
    head = load_eagle3(tmp_path, TARGET, lm_head=target_head)
    assert torch.equal(head.lm_head.weight, target_head) and head.to_target(torch.tensor([7])).item() == 7
    with pytest.raises(ValueError, match="no target lm_head given"):
        load_eagle3(tmp_path, TARGET)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "draft_vocab_size": 100}))
    with pytest.raises(ValueError, match="draft vocabulary of 100 of the target's 300"):
        load_eagle3(tmp_path, TARGET, lm_head=target_head)


def test_the_engine_loads_such_a_head_with_its_target(tiny_llama, tmp_path):
    """load_draft hands the target's lm_head over: the head drafts through it."""
    from toolkit.infer.drafts import random_head
    from toolkit.infer.draft_folder import load_draft
    from toolkit.infer.loading import load_target

    target = load_target(tiny_llama)
    save_eagle3(random_head(target.config), tmp_path, json.loads((tiny_llama / "config.json").read_text()),
                str(tiny_llama), "0" * 16)
    w = {k: v for k, v in load_file(str(tmp_path / "model.safetensors")).items()
         if k not in ("lm_head.weight", "d2t", "t2d")}
    save_file(w, str(tmp_path / "model.safetensors"))
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "draft_vocab_size": None}))
    got = load_draft(str(tmp_path), target, None)
    assert torch.allclose(got.lm_head.weight.float(), target.lm_head.weight.float())
