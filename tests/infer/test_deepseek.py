"""DeepSeek-V3 targets (MLA attention, MoE MLPs, yarn RoPE) in the engine, against transformers on tiny random
configs: logits and hidden states match; greedy decoding through the KV cache equals transformers' generate;
the NextN MTP layer such a target ships loads with every weight mapped, matches a reference built from
transformers' own DeepSeek decoder layer, and drafts losslessly."""
import json

import pytest
import torch
from hf_reference import assert_forward_matches, assert_greedy_matches
from safetensors.torch import load_file, save_file

from toolkit.infer.config import ConfigError, ModelConfig
from toolkit.infer.draft_folder import load_draft
from toolkit.infer.engine import Engine
from toolkit.infer.loading import load_target
from toolkit.infer.model import Block
from toolkit.infer.mtp import MTPHead
from toolkit.infer.sampling import SamplingParams
from toolkit.infer.tree import TreeConfig

V, H, LAYERS = 300, 64, 3
BASE = dict(vocab_size=V, hidden_size=H, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=LAYERS,
            num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8,
            num_experts_per_tok=2, n_group=4, topk_group=2, first_k_dense_replace=1, kv_lora_rank=16,
            qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, max_position_embeddings=512,
            routed_scaling_factor=2.5, bos_token_id=0, eos_token_id=1, num_nextn_predict_layers=1)
VARIANTS = {
    "q_lora+yarn+interleaved": dict(q_lora_rank=24, rope_interleave=True, rope_scaling={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128, "mscale": 1.0,
        "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1}),
    "q_proj+rope+halves": dict(q_lora_rank=None, rope_interleave=False),
}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def deepseek(request, tmp_path_factory):
    """(folder, transformers model): a tiny random DeepSeek-V3 saved by transformers."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(0)
    cfg = DeepseekV3Config(**BASE, **VARIANTS[request.param])
    model = DeepseekV3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in model.model.layers[1:]:  # routing that depends on the groups and the correction bias
            layer.mlp.gate.weight.normal_(0.0, 0.5)
            layer.mlp.gate.e_score_correction_bias.normal_(0.0, 0.3)
        model.lm_head.weight.normal_(0.0, 1.0)  # a peaked next-token distribution
    folder = tmp_path_factory.mktemp("deepseek")
    model.save_pretrained(folder)
    return folder, model


def test_config_reads_mla_moe_and_refuses_what_it_cannot_run():
    from transformers import DeepseekV3Config

    d = DeepseekV3Config(**BASE, **VARIANTS["q_lora+yarn+interleaved"]).to_dict()
    c = ModelConfig.from_hf(d)
    assert c.mla.kv_lora_rank == 16 and c.moe.num_experts == 8 and c.cache_dims == (4, 24, 12)
    with pytest.raises(ConfigError, match=r"quantization_config: awq\) is not supported; accepted: fp8"):
        ModelConfig.from_hf({**d, "quantization_config": {"quant_method": "awq"}})
    with pytest.raises(ConfigError, match="scoring_func"):
        ModelConfig.from_hf({**d, "scoring_func": "softmax"})
    with pytest.raises(ConfigError, match="topk_group"):
        ModelConfig.from_hf({**d, "topk_group": 5})


def test_logits_and_hidden_states_match_transformers(deepseek):
    folder, hf = deepseek
    assert_forward_matches(load_target(folder), hf, 19, [0, 1, -1])


def test_greedy_decoding_equals_transformers_generate(deepseek):
    folder, hf = deepseek
    assert_greedy_matches(load_target(folder), hf, 12, trees=())


def with_mtp_layer(folder, out):
    """The target plus a NextN MTP layer `model.layers.{num_hidden_layers}.*` (a block of the target's kind, MoE
    here, and enorm, hnorm, eh_proj, shared_head), as DeepSeek-V3 and GLM-4.5 checkpoints ship it. Returns the
    MTP layer's weights."""
    out.mkdir()
    cfg = json.loads((folder / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(cfg))
    layers, h, v = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]
    torch.manual_seed(5)
    block = Block(ModelConfig.from_hf(cfg), layers)
    g = torch.Generator().manual_seed(6)
    p = f"model.layers.{layers}."
    shapes = {k: list(t.shape) for k, t in block.state_dict().items()}
    shapes.update({"enorm.weight": [h], "hnorm.weight": [h], "eh_proj.weight": [h, 2 * h],
                   "shared_head.norm.weight": [h], "shared_head.head.weight": [v, h], "embed_tokens.weight": [v, h]})
    mtp = {p + k: torch.randn(*shape, generator=g) * 0.2 + (1.0 if k.endswith("norm.weight") else 0.0)
           for k, shape in shapes.items()}
    save_file({**load_file(str(folder / "model.safetensors")), **mtp}, str(out / "model.safetensors"))
    return mtp


def test_native_nextn_layer_maps_every_weight_and_matches_transformers(deepseek, tmp_path):
    import transformers.models.deepseek_v3.modeling_deepseek_v3 as modeling

    folder, hf = deepseek
    mtp = with_mtp_layer(folder, tmp_path / "t")
    target = load_target(tmp_path / "t")
    head = load_draft(str(tmp_path / "t"), target, None)
    assert isinstance(head, MTPHead) and type(head.block.mlp).__name__ == "MoE"
    p = f"model.layers.{LAYERS}."
    for k, v in head.block.state_dict().items():
        assert torch.equal(v, mtp[p + k]), k
    for ours in ("enorm", "hnorm", "eh_proj", "shared_head.norm"):
        assert torch.equal(head.get_submodule(ours).weight, mtp[p + ours + ".weight"])

    # the reference: transformers' own DeepSeek decoder layer (MoE, index LAYERS) with these weights
    layer = modeling.DeepseekV3DecoderLayer(hf.config, LAYERS).eval()
    state = {k.removeprefix(p): v for k, v in mtp.items() if k.startswith(p)}
    E = hf.config.n_routed_experts
    e = [f"mlp.experts.{i}." for i in range(E)]
    state["mlp.experts.gate_up_proj"] = torch.stack(
        [torch.cat([state.pop(x + "gate_proj.weight"), state.pop(x + "up_proj.weight")]) for x in e])
    state["mlp.experts.down_proj"] = torch.stack([state.pop(x + "down_proj.weight") for x in e])
    own = {"enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight", "shared_head.head.weight",
           "embed_tokens.weight"}
    layer.load_state_dict({k: v for k, v in state.items() if k not in own}, strict=True)
    rope = modeling.DeepseekV3RotaryEmbedding(hf.config)
    T = 7
    g = torch.Generator().manual_seed(2)
    emb, hid = torch.randn(1, T, H, generator=g), torch.randn(1, T, H, generator=g)
    pos = torch.arange(T)[None]

    def rms(x, w):
        return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    with torch.no_grad():
        logp, out = head(emb, hid, pos, head.new_cache(16))
        x = torch.cat([rms(emb, state["enorm.weight"]), rms(hid, state["hnorm.weight"])], -1) @ state["eh_proj.weight"].T
        mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
        y = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=rope(x, pos))
        want_out = rms(y[0] if isinstance(y, tuple) else y, state["shared_head.norm.weight"])
        want = (want_out @ hf.lm_head.weight.T).log_softmax(-1)
    assert (out - want_out).abs().max() < 1e-4
    assert (logp - want).abs().max() < 1e-4


def test_nextn_draft_is_lossless_and_a_moe_target_and_head_run_eagerly(deepseek, tmp_path):
    folder, _ = deepseek
    with_mtp_layer(folder, tmp_path / "t")
    target = load_target(tmp_path / "t")
    head = load_draft(str(tmp_path / "t"), target, None)
    prompts, p = [[5, 17, 33, 8, 61], [9, 4, 70]], SamplingParams(max_new_tokens=16)
    want = [r.tokens for r in Engine(target, max_len=64, max_batch=2).generate_batch(prompts, p)]
    got = Engine(target, head, TreeConfig(2, 1, 3), max_len=64, max_batch=2).generate_batch(prompts, p)
    assert [r.tokens for r in got] == want
    assert not target.graphable and not head.graphable
    from toolkit.infer.graphs import eager_capture

    graphed = Engine(target, head, TreeConfig(2, 1, 3), max_len=64, max_batch=2, cuda_graphs=True,
                     graph_capture=eager_capture)
    r = graphed.runner
    assert r.target_graphs is None and r.draft_graphs is None and r.draft_loop is None  # both MoE: eager
    assert [x.tokens for x in graphed.generate_batch(prompts, p)] == want


def test_the_prefix_cache_keeps_mla_and_nextn_greedy_exact(deepseek, tmp_path):
    """Second turns over a cached prefix (MLA's compressed KV and the NextN draft's pairs copied) decode as plain."""
    folder, _ = deepseek
    with_mtp_layer(folder, tmp_path / "t")
    target = load_target(tmp_path / "t")
    head = load_draft(str(tmp_path / "t"), target, None)
    prompts, p = [[5, 17, 33, 8, 61], [9, 4, 70]], SamplingParams(max_new_tokens=12)
    cached = Engine(target, head, TreeConfig(2, 1, 3), max_len=64, max_batch=2, prefix_cache_rows=2)
    later = [q + r.tokens + [3, 4] for q, r in zip(prompts, cached.generate_batch(prompts, p))]
    got = cached.generate_batch(later, p)
    assert [r.tokens for r in got] == [r.tokens for r in Engine(target, max_len=64, max_batch=2).generate_batch(later, p)]
    assert all(r.cached_tokens >= len(q) for r, q in zip(got, prompts))


def test_kimi_k2_is_read_as_the_deepseek_v3_it_is(deepseek, tmp_path):
    """Kimi-K2 ships DeepSeek-V3's architecture under `model_type: kimi_k2` (Moonshot's README: engines without
    it may rename it to deepseek_v3): the same folder under that name gives the same model."""
    import shutil

    folder, hf = deepseek
    shutil.copytree(folder, tmp_path / "k2")
    cfg = json.loads((folder / "config.json").read_text())
    (tmp_path / "k2" / "config.json").write_text(json.dumps({**cfg, "model_type": "kimi_k2"}))
    ids = torch.randint(0, V, (1, 11), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        k2, want = load_target(tmp_path / "k2")(ids)[0], hf(ids).logits
    assert (k2 - want).abs().max() < 1e-4
    assert ModelConfig.from_hf({**cfg, "model_type": "kimi_k2"}).mla is not None
