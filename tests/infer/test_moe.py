"""Mixtral, Qwen2-MoE and Qwen3-MoE targets in the engine, against transformers on tiny random configs saved by
transformers (Mixtral's block_sparse_moe.*.w1/w2/w3 names included): logits and aux hidden states match, greedy
decoding equals transformers' generate, an EAGLE-3 draft over them is lossless, and their configs are read as
transformers reads them (dense layers, sliding windows, qkv biases)."""
import pytest
import torch
from hf_reference import PROMPTS, assert_forward_matches, assert_greedy_matches

from toolkit.infer.config import ConfigError, ModelConfig
from toolkit.infer.engine import Engine
from toolkit.infer.loading import load_target
from toolkit.infer.hf_names import our_name as hf_name
from toolkit.infer.moe import MoE
from toolkit.infer.sampling import SamplingParams
from toolkit.infer.tree import TreeConfig

V = 211
TINY = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, bos_token_id=0, eos_token_id=1)
CASES = {
    "mixtral": ("MixtralConfig", dict(num_local_experts=6, num_experts_per_tok=2)),
    "qwen2_moe": ("Qwen2MoeConfig", dict(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32,
                                         shared_expert_intermediate_size=48, mlp_only_layers=[2])),
    "qwen2_moe+norm_topk+step2": ("Qwen2MoeConfig", dict(num_experts=8, num_experts_per_tok=3, norm_topk_prob=True,
                                                         moe_intermediate_size=32, shared_expert_intermediate_size=40,
                                                         decoder_sparse_step=2, qkv_bias=False)),
    "qwen3_moe": ("Qwen3MoeConfig", dict(num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32,
                                         norm_topk_prob=True, mlp_only_layers=[0], head_dim=24)),
    "qwen3_moe+bias+step2": ("Qwen3MoeConfig", dict(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32,
                                                    decoder_sparse_step=2, attention_bias=True)),
}


def tiny_moe(case, folder):
    import transformers

    cls, extra = CASES[case]
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(getattr(transformers, cls)(**TINY, **extra),
                                                          dtype=torch.float32).eval()
    with torch.no_grad():  # random norms and biases, and routers peaked enough that tokens part ways
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.normal_(1.0 if "norm" in name else 0.0, 0.2)
            elif name.endswith("gate.weight"):
                p.normal_(0.0, 0.5)
        model.lm_head.weight.normal_(0.0, 1.0)
    model.save_pretrained(folder)
    return model


@pytest.fixture(scope="module", params=sorted(CASES))
def moe(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param.replace("+", "_"))
    return request.param, folder, tiny_moe(request.param, folder)


def test_logits_and_aux_hidden_states_match_transformers(moe):
    case, folder, hf = moe
    ours = load_target(folder)
    c = ours.config
    sparse = [isinstance(layer.mlp, MoE) for layer in ours.layers]
    want_sparse = [type(layer.mlp).__name__.endswith("SparseMoeBlock") for layer in hf.model.layers]
    assert sparse == want_sparse and any(sparse), (case, sparse)
    assert_forward_matches(ours, hf, 33, range(c.num_layers - 1))  # every layer's output but the last (normed)
    ids = torch.randint(0, V, (2, 33), generator=torch.Generator().manual_seed(1))
    hit = torch.stack([hf.model.layers[i].mlp.gate(hf.model.embed_tokens(ids).reshape(-1, 64))[2]
                       for i in range(len(sparse)) if sparse[i]])
    assert len(hit.unique()) > 2  # the routing really spreads tokens over several experts


def test_greedy_decoding_equals_transformers_generate_and_a_draft_is_lossless(moe):
    case, folder, hf = moe
    target = load_target(folder)
    head, want = assert_greedy_matches(target, hf, 14, trees=(TreeConfig(3, 1, 4), TreeConfig(3, 3, 8)))
    # CUDA graphs asked for (captured eagerly here): the MoE target runs eagerly, its dense head from the graphs
    from toolkit.infer.graphs import eager_capture

    assert not target.graphable and head.graphable
    graphed = Engine(target, head, TreeConfig(3, 3, 8), max_len=64, max_batch=2, cuda_graphs=True,
                     graph_capture=eager_capture)
    assert graphed.runner.target_graphs is None and graphed.runner.draft_loop is not None
    assert [r.tokens for r in graphed.generate_batch(PROMPTS, SamplingParams(max_new_tokens=14), stop_ids={1})] == want, case


def test_a_bf16_target_keeps_a_softmax_router_in_bf16_as_transformers_does(tmp_path):
    tiny_moe("qwen3_moe", tmp_path)
    target = load_target(tmp_path, dtype=torch.bfloat16)
    assert target.layers[1].mlp.gate.weight.dtype == torch.bfloat16  # DeepSeek's alone stays fp32 (test_fp32.py)
    logits, _ = target(torch.tensor([[5, 17, 33, 8]]))
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()


def test_mixtral_checkpoint_names_are_mapped():
    moe = "layers.3.block_sparse_moe.experts.12."
    assert hf_name("mixtral", moe + "w1.weight") == "layers.3.mlp.experts.12.gate_proj.weight"
    assert hf_name("mixtral", moe + "w3.weight") == "layers.3.mlp.experts.12.up_proj.weight"
    assert hf_name("mixtral", moe + "w2.weight") == "layers.3.mlp.experts.12.down_proj.weight"
    assert hf_name("mixtral", "layers.0.block_sparse_moe.gate.weight") == "layers.0.mlp.gate.weight"
    assert hf_name("qwen3_moe", "layers.0.mlp.experts.7.w2.weight") == "layers.0.mlp.experts.7.w2.weight"


def _cfg(kind, **extra):
    base = {"model_type": kind, "vocab_size": V, "hidden_size": 64, "intermediate_size": 96,
            "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2}
    return ModelConfig.from_hf({**base, **extra})


def test_configs_read_as_transformers_reads_them():
    import transformers

    q3 = _cfg("qwen3_moe", num_experts=8, num_experts_per_tok=2, decoder_sparse_step=3, mlp_only_layers=[5],
              num_key_value_heads=None)
    assert [q3.moe.sparse(i) for i in range(6)] == [False, False, True, False, False, False]
    assert q3.num_kv_heads == 4 and q3.qk_norm and not q3.qkv_bias and not q3.moe.norm_topk_prob
    assert q3.head_dim == 16 and q3.moe.intermediate_size == 768 and q3.moe.shared_size == 0
    assert _cfg("qwen3_moe", use_sliding_window=True).sliding_window == 4096  # every layer, no max_window_layers
    assert _cfg("qwen3_moe", use_sliding_window=False, sliding_window=64).sliding_window is None
    q2 = _cfg("qwen2_moe", num_attention_heads=16, num_key_value_heads=None)  # the class defaults
    assert q2.qkv_bias and not q2.attention_bias and q2.num_kv_heads == 16 and q2.moe.shared_gate
    assert (q2.moe.num_experts, q2.moe.top_k, q2.moe.shared_size) == (60, 4, 5632)
    assert not _cfg("qwen2_moe", qkv_bias=False).qkv_bias
    slid = transformers.Qwen2MoeConfig(num_hidden_layers=6, use_sliding_window=True, sliding_window=64).to_dict()
    assert ModelConfig.from_hf(slid).sliding_window == 64  # its layer_types slide the even layers
    assert _cfg("qwen2_moe", use_sliding_window=True, sliding_window=64, max_window_layers=0).sliding_window is None
    assert _cfg("qwen2_moe", num_experts=0).moe is None  # transformers builds every layer dense then
    mx = _cfg("mixtral", num_attention_heads=8, num_key_value_heads=None)
    assert (mx.moe.num_experts, mx.moe.top_k, mx.moe.intermediate_size, mx.num_kv_heads) == (8, 2, 96, 8)
    assert mx.sliding_window is None and _cfg("mixtral", sliding_window=128).sliding_window == 128
    assert mx.rms_norm_eps == 1e-5 and _cfg("mixtral", rms_norm_eps=1e-6).rms_norm_eps == 1e-6  # the class default
    with pytest.raises(ConfigError, match="num_experts_per_tok 9"):
        _cfg("mixtral", num_local_experts=8, num_experts_per_tok=9)
    with pytest.raises(ConfigError, match="decoder_sparse_step"):
        _cfg("qwen3_moe", decoder_sparse_step=0)
