"""GPT-OSS targets in the engine, against transformers on tiny random models it saves: attention sinks, q/k/v/o
biases, sliding and full layers alternating (a window of 8 under 33 tokens), the biased top-k router and the
clamped-SwiGLU experts; logits and aux hidden states match, greedy decoding equals `generate`, EAGLE-3 drafts
are lossless; the config is read as GptOssConfig reads it; OpenAI's MXFP4 experts load as their dense values."""
import json

import pytest
import torch
from gpt_oss_model import V, tiny_gpt_oss
from hf_reference import assert_forward_matches, assert_greedy_matches
from safetensors.torch import load_file, save_file

from toolkit.infer import mxfp4
from toolkit.infer.attention import eager_attention
from toolkit.infer.config import ConfigError, ModelConfig
from toolkit.infer.gpt_oss import GptOssMoE
from toolkit.infer.loading import load_target
from toolkit.infer.tree import TreeConfig


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt_oss")
    return folder, tiny_gpt_oss(folder)


def test_logits_and_aux_hidden_states_match_transformers(gpt_oss):
    folder, hf = gpt_oss
    ours = load_target(folder)
    c = ours.config
    assert c.attention_sinks and c.attention_bias and c.qkv_bias and c.sliding_window == 8
    assert [c.slides(i) for i in range(4)] == [True, False, True, False]  # layer_types as transformers saved them
    assert all(isinstance(layer.mlp, GptOssMoE) for layer in ours.layers)
    assert_forward_matches(ours, hf, 33, range(c.num_layers - 1))
    ids = torch.randint(0, V, (2, 33), generator=torch.Generator().manual_seed(1))
    hit = torch.stack([hf.model.layers[i].mlp.router(hf.model.embed_tokens(ids).reshape(-1, 64))[2]
                       for i in range(4)])
    assert len(hit.unique()) > 3  # the routing really spreads tokens over the experts
    with torch.no_grad():  # the sinks matter here: without them the logits move
        for layer in ours.layers:
            layer.self_attn.sinks.fill_(-1e4)
        assert (ours(ids)[0] - hf(ids).logits).abs().max() > 1e-2


def test_greedy_decoding_equals_generate_and_eagle3_drafts_are_lossless(gpt_oss):
    folder, hf = gpt_oss
    target = load_target(folder)
    assert not target.graphable  # a MoE target runs eagerly
    assert_greedy_matches(target, hf, 14, trees=(TreeConfig(3, 1, 4), TreeConfig(3, 3, 8)))


def reference_attention(q, k, v, mask, sinks):
    """transformers' eager GPT-OSS attention: kv heads repeated, the sink a last softmax column, dropped after.
    (Not the kernels' reference: importing Triton here, before the kernel tests set TRITON_INTERPRET, would leave
    their worker without a driver.)"""
    k, v = k.repeat_interleave(q.shape[1] // k.shape[1], 1), v.repeat_interleave(q.shape[1] // k.shape[1], 1)
    scores = (q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5).masked_fill(~mask[:, None], float("-inf"))
    sink = sinks.view(1, -1, 1, 1).expand(*scores.shape[:3], 1)
    return torch.cat([scores, sink], -1).softmax(-1)[..., :-1] @ v


def test_eager_attention_equals_the_reference_masked_and_causal():
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 4, 5, 8, generator=g), torch.randn(2, 2, 9, 8, generator=g), torch.randn(2, 2, 9, 8,
                                                                                                      generator=g)
    sinks = torch.randn(4, generator=g)
    mask = torch.rand(2, 5, 9, generator=g) < 0.6
    mask[1, 2] = False  # a row that sees nothing: all its weight on the sink, output zero
    bias = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))[:, None]
    got = eager_attention(q, k, v, bias, sinks)
    assert (got - reference_attention(q, k, v, mask, sinks=sinks)).abs().max() < 1e-5
    assert got[1, :, 2].abs().max() == 0
    causal = torch.ones(9, 9).tril().bool()[None].expand(2, 9, 9)
    q9 = torch.randn(2, 4, 9, 8, generator=g)
    assert (eager_attention(q9, k, v, None, sinks) - reference_attention(q9, k, v, causal, sinks=sinks)).abs().max() \
        < 1e-5
    # in chunks of queries (a long prefill's scores bounded): the same, causal (keys cut per chunk) and masked
    for block in (2 * 4 * 9, 3 * 2 * 4 * 9, 4 * 2 * 4 * 9):  # 1, 3 and 4 query rows a chunk
        assert (eager_attention(q9, k, v, None, sinks, block) - eager_attention(q9, k, v, None, sinks)).abs().max() \
            < 1e-6
        assert (eager_attention(q, k, v, bias, sinks, block) - got).abs().max() < 1e-6
    # queries at the last slots of a longer cache (a chunked prefill after a cached prefix)
    late = torch.ones(9, 9).tril().bool()[-4:][None].expand(2, 4, 9)
    assert (eager_attention(q9[:, :, -4:], k, v, None, sinks, 2 * 4 * 9)
            - reference_attention(q9[:, :, -4:], k, v, late, sinks=sinks)).abs().max() < 1e-5


def test_norms_round_as_transformers_gpt_oss_does_in_bf16():
    """GptOssRMSNorm scales by its weight in fp32 and rounds once; Llama's rounds, then scales: a gpt-oss config
    gives every target norm GPT-OSS's rounding, bit for bit, and the Llama one parts from it."""
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRMSNorm

    from toolkit.infer.config import ModelConfig
    from toolkit.infer.norm import RMSNorm

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(4, 7, 64, generator=g).bfloat16(), (torch.randn(64, generator=g) * 0.5 + 1).bfloat16()
    ref = GptOssRMSNorm(64, eps=1e-5).bfloat16()
    ours, llama = RMSNorm(64, 1e-5, fp32_product=True).bfloat16(), RMSNorm(64, 1e-5).bfloat16()
    for m in (ref, ours, llama):
        m.weight.data.copy_(w)
    with torch.no_grad():
        assert torch.equal(ours(x), ref(x)) and not torch.equal(llama(x), ref(x))
    given = dict(vocab_size=V, hidden_size=64, intermediate_size=48, num_hidden_layers=2, num_attention_heads=8)
    assert ModelConfig.from_hf({**given, "model_type": "gpt_oss", "num_local_experts": 4}).norm_fp32_product
    assert not ModelConfig.from_hf({**given, "model_type": "llama"}).norm_fp32_product


def test_the_config_reads_gpt_oss_defaults_as_transformers_does():
    import transformers

    given = dict(model_type="gpt_oss", vocab_size=V, hidden_size=64, intermediate_size=48, num_hidden_layers=6,
                 num_attention_heads=16, num_local_experts=6)
    theirs, ours = transformers.GptOssConfig(**given), ModelConfig.from_hf(given)
    assert ours.head_dim == theirs.head_dim == 64 and ours.num_kv_heads == theirs.num_key_value_heads == 8
    assert ours.attention_bias == theirs.attention_bias is True and ours.rms_norm_eps == theirs.rms_norm_eps
    assert ours.sliding_window == theirs.sliding_window == 128
    assert [not ours.slides(i) for i in range(6)] == [t == "full_attention" for t in theirs.layer_types]
    assert ours.rope_theta == theirs.rope_parameters["rope_theta"] == 150000
    assert {k: v for k, v in ours.rope_scaling.items()} == {k: v for k, v in theirs.rope_parameters.items()
                                                             if k != "rope_theta"}
    assert (ours.moe.top_k, ours.moe.swiglu_limit, ours.moe.swiglu_alpha) == (4, 7.0, 1.702)
    with pytest.raises(ConfigError, match="quantized checkpoint.*fp8"):
        ModelConfig.from_hf({**given, "quantization_config": {"quant_method": "bitsandbytes"}})


def test_mxfp4_dequantizes_as_transformers():
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 10, 2, 16), dtype=torch.uint8, generator=g)
    scales = torch.randint(118, 132, (3, 10, 2), dtype=torch.uint8, generator=g)
    want = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    assert torch.equal(mxfp4.dequantize(blocks, scales, torch.float32), want)
    assert mxfp4.dequantize(blocks, scales).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="without their other half"):
        mxfp4.join_packed({"layers.0.mlp.experts.down_proj_blocks": blocks}, torch.float32)
    with pytest.raises(ValueError, match=r"expected \[E, N, G, 16\]"):
        mxfp4.dequantize(blocks[..., :8], scales)


def test_a_released_mxfp4_checkpoint_loads_as_its_dense_model(tmp_path):
    """OpenAI's layout: the experts' gate_up_proj / down_proj as _blocks + _scales, quantization_config mxfp4.
    Random codes stand in for a quantizer: the dense model holds exactly their values."""
    dense, packed = tmp_path / "dense", tmp_path / "packed"
    hf = tiny_gpt_oss(dense, intermediate_size=64)  # I and H multiples of 32: whole MXFP4 groups
    g = torch.Generator().manual_seed(2)
    weights, codes = load_file(str(dense / "model.safetensors")), {}
    for name in [n for n in weights if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        E, rows, cols = weights.pop(name).shape                                   # [E, in, out]
        codes[name + "_blocks"] = torch.randint(0, 256, (E, cols, rows // 32, 16), dtype=torch.uint8, generator=g)
        codes[name + "_scales"] = torch.randint(120, 126, (E, cols, rows // 32), dtype=torch.uint8, generator=g)
        layer, proj = name.split(".")[2], name.rsplit(".", 1)[1]
        with torch.no_grad():
            getattr(hf.model.layers[int(layer)].mlp.experts, proj).copy_(
                mxfp4.dequantize(codes[name + "_blocks"], codes[name + "_scales"], torch.float32))
    packed.mkdir()
    save_file({**weights, **codes}, str(packed / "model.safetensors"))
    cfg = json.loads((dense / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}
    (packed / "config.json").write_text(json.dumps(cfg))
    assert_forward_matches(load_target(packed), hf, 20, [0, 2])
    # an MTP head started from the last layer reads the same dequantized experts
    from toolkit.train.head import target_layer

    last = target_layer(packed, 3, ModelConfig.from_folder(packed))
    assert torch.equal(last["mlp.experts.down_proj"], hf.model.layers[3].mlp.experts.down_proj)
