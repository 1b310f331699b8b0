"""Llama 4 targets (text: NoPE layers with tuned query temperature, chunked attention, L2 q/k norms, interleaved
RoPE, sigmoid-scaled MoE inputs with a shared expert, dense layers of their own width) in the engine, against
transformers on tiny random configs: logits and hidden states match past several chunks, greedy decoding equals
transformers' generate plain and with EAGLE-3 drafts (chains, trees, tree tokens across a chunk boundary), a
multimodal checkpoint's text model loads, and what runs Llama's layer pieces refuses it by name."""
import json

import pytest
import torch
from hf_reference import assert_forward_matches, assert_greedy_matches
from safetensors.torch import load_file, save_file

from toolkit.infer.config import ModelConfig
from toolkit.infer.loading import load_target
from toolkit.infer.tree import TreeConfig

V, CHUNK = 181, 8
BASE = dict(vocab_size=V, hidden_size=64, intermediate_size=48, intermediate_size_mlp=96, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=256, bos_token_id=0, eos_token_id=1,
            pad_token_id=0, attention_chunk_size=CHUNK, num_local_experts=4,
            rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
VARIANTS = {
    # Scout-like: every layer MoE (top 1), NoPE every 2nd layer, temperature tuned from position 3 on
    "scout": dict(num_hidden_layers=4, no_rope_layer_interval=2, floor_scale=4, interleave_moe_layer_step=1),
    # Maverick-like: MoE on every 2nd layer (top 2), no q/k norm, no temperature tuning
    "maverick": dict(num_hidden_layers=4, interleave_moe_layer_step=2, num_experts_per_tok=2, use_qk_norm=False,
                     attn_temperature_tuning=False),
}


def tiny_llama4(case: str):
    """A random transformers Llama 4 of VARIANTS[case] (seed 0): routing that varies by token, a peaked readout."""
    from transformers import AutoModelForCausalLM, Llama4TextConfig

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Llama4TextConfig(**BASE, **VARIANTS[case]), dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "router" in name or "experts" in name:
                p.normal_(0.0, 0.3)  # routing that varies by token; experts that matter
        model.lm_head.weight.normal_(0.0, 1.0)
    return model


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def llama4(request, tmp_path_factory):
    model = tiny_llama4(request.param)
    folder = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(folder)
    return request.param, folder, model


def test_the_config_reads_what_transformers_reads(llama4):
    case, folder, hf = llama4
    c = ModelConfig.from_folder(folder)
    l4, hc = c.llama4, hf.config
    assert l4.nope_layers == tuple(i for i, r in enumerate(hc.no_rope_layers) if not r)
    assert l4.chunked_layers == tuple(i for i, t in enumerate(hc.layer_types) if t == "chunked_attention")
    assert [c.moe.sparse(i) for i in range(4)] == [i in hc.moe_layers for i in range(4)]
    assert c.intermediate_size == 96 and c.moe.intermediate_size == c.moe.shared_size == 48
    assert (l4.qk_l2_norm, l4.floor_scale is not None) == ((True, True) if case == "scout" else (False, False))


def test_logits_and_hidden_states_match_transformers_over_several_chunks(llama4):
    _, folder, hf = llama4
    assert_forward_matches(load_target(folder), hf, 3 * CHUNK + 5, [0, 1, 2, -1])


def test_greedy_decoding_equals_generate_and_eagle3_drafts_are_lossless(llama4):
    """Prompts of 7 and 3 tokens and 20 new ones: verify steps whose trees straddle chunk boundaries."""
    _, folder, hf = llama4
    assert_greedy_matches(load_target(folder), hf, 20, trees=(TreeConfig(3, 1, 4), TreeConfig(3, 3, 8)),
                          prompts=[[5, 17, 33, 8, 61, 7, 22], [9, 4, 30]])


def test_tree_tokens_across_a_chunk_boundary_see_what_their_path_would(llama4):
    """A verify step's tree over a 7-token prefix (chunk 8): siblings at position 7 (slots 7, 8), a path 7 -> 8 -> 9
    in slots 8 -> 9 -> 10. The node at position 8 starts a chunk and must not see its parent at position 7, though
    the parent sits in slot 8: each node's logits equal a plain forward over the prefix and its path."""
    from toolkit.infer.kv_cache import KVCache

    _, folder, _ = llama4
    target = load_target(folder)
    prefix, tokens = [5, 17, 33, 8, 61, 7, 22], [40, 11, 3, 9]  # nodes: a (pos 7), b (pos 7), c <- b, d <- c
    paths = [[40], [11], [11, 3], [11, 3, 9]]
    cache = KVCache(target.config, 1, 32)
    with torch.no_grad():
        target(torch.tensor([prefix]), torch.arange(7)[None], cache, torch.arange(7)[None])
        mask = torch.zeros(1, 4, 11, dtype=torch.bool)
        mask[:, :, :7] = True
        for node, seen in enumerate([[7], [8], [8, 9], [8, 9, 10]]):
            mask[0, node, seen] = True
        logits, _ = target(torch.tensor([tokens]), torch.tensor([[7, 7, 8, 9]]), cache, torch.tensor([[7, 8, 9, 10]]),
                           mask)
        for node, path in enumerate(paths):
            want = target(torch.tensor([prefix + path]))[0][0, -1]
            assert (logits[0, node] - want).abs().max() < 1e-4, node


def test_a_multimodal_llama4_checkpoint_loads_its_text_model(llama4, tmp_path):
    """model_type llama4: the text config nested, the weights under language_model.model. / language_model.lm_head,
    a vision_model beside them that is not loaded."""
    _, folder, _ = llama4
    text = json.loads((folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama4", "text_config": text,
                                                      "vision_config": {"model_type": "llama4_vision_model"}}))
    w = {"language_model." + k: v for k, v in load_file(str(folder / "model.safetensors")).items()}
    w["vision_model.patch_embedding.linear.weight"] = torch.zeros(4, 12)
    w["multi_modal_projector.linear_1.weight"] = torch.zeros(4, 4)
    save_file(w, str(tmp_path / "model.safetensors"))
    ids = torch.tensor([[5, 17, 33, 8, 61, 7, 22, 40, 11, 3, 9]])
    with torch.no_grad():
        assert torch.equal(load_target(tmp_path)(ids)[0], load_target(folder)(ids)[0])


def test_experts_stored_one_by_one_load_as_the_stacked_ones(llama4, tmp_path):
    """llm-compressor's Llama 4 exports keep each expert's Linear weights apart (feed_forward.experts.{e}.gate_proj /
    up_proj [I, H], down_proj [H, I]): stacked on load into transformers' [E, H, 2I] / [E, I, H]; one missing is
    refused by name."""
    _, folder, _ = llama4
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    w, split = load_file(str(folder / "model.safetensors")), {}
    for name, t in w.items():
        if name.endswith("experts.gate_up_proj"):
            gate, up = t.chunk(2, dim=-1)
            for e in range(t.shape[0]):
                base = name.removesuffix("gate_up_proj") + f"{e}."
                split[base + "gate_proj.weight"], split[base + "up_proj.weight"] = gate[e].t(), up[e].t()
        elif name.endswith("experts.down_proj"):
            for e in range(t.shape[0]):
                split[name.removesuffix("down_proj") + f"{e}.down_proj.weight"] = t[e].t()
        else:
            split[name] = t
    assert len(split) > len(w)
    save_file({k: v.contiguous() for k, v in split.items()}, str(tmp_path / "model.safetensors"))
    a, b = load_target(tmp_path).state_dict(), load_target(folder).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    del split[next(k for k in split if k.endswith("experts.2.up_proj.weight"))]
    save_file({k: v.contiguous() for k, v in split.items()}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing \['layers.\d+.mlp.experts.2.up_proj.weight'\]"):
        load_target(tmp_path)


def test_the_paths_built_from_llama_pieces_refuse_llama4(llama4):
    from toolkit.infer.mtp import MTPHead

    _, folder, _ = llama4
    target = load_target(folder)
    with pytest.raises(ValueError, match="MTP head .* does not cover llama4_text"):
        MTPHead(target.config, target.lm_head.weight.detach())


def test_bf16_rope_rounds_once_as_transformers_complex_multiply(llama4):
    """transformers rotates Llama 4's q / k as float32 complex numbers and rounds to bf16 once: a RoPE layer's
    queries and keys (after the L2 norm where there is one) equal its bit for bit in bf16, de-interleaved as
    hf_names stores them; rotating in bf16 (two roundings) would differ in many elements."""
    from transformers import AutoModelForCausalLM

    from toolkit.infer.attention import rope_cos_sin

    _, folder, _ = llama4
    ours = load_target(folder, dtype=torch.bfloat16)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
    layer = next(i for i in range(ours.config.num_layers) if i not in ours.config.llama4.nope_layers)
    T, D = 40, ours.config.head_dim
    torch.manual_seed(1)
    x, positions = torch.randn(1, T, ours.config.hidden_size).to(torch.bfloat16), torch.arange(100, 100 + T)[None]
    with torch.no_grad():
        cos, sin = rope_cos_sin(positions, ours.inv_freq, torch.float32, ours.config.rope_attention_factor())
        q, k, _ = ours.layers[layer].self_attn._project(x, cos, sin, None, layer, None, T)
        att = hf.model.layers[layer].self_attn
        hq, hk = att.q_proj(x).view(1, T, -1, D), att.k_proj(x).view(1, T, -1, D)
        from transformers.models.llama4.modeling_llama4 import apply_rotary_emb

        hq, hk = apply_rotary_emb(hq, hk, hf.model.rotary_emb(x, positions))
        if hasattr(att, "qk_norm"):
            hq, hk = att.qk_norm(hq), att.qk_norm(hk)
    halves = torch.cat([torch.arange(0, D, 2), torch.arange(1, D, 2)])  # interleaved pairs -> half-split
    for mine, theirs in ((q, hq), (k, hk)):
        assert torch.equal(mine, theirs.transpose(1, 2)[..., halves])
