"""Tensors that stay float32 when a model or a draft head is moved to bf16 (toolkit/infer/fp32.py): RoPE's
inverse frequencies in every draft kind and the target (a bf16 inv_freq puts a draft's rotations ~0.4 rad away
from the target's at position 4,000), and DeepSeek-V3's router weight and correction bias, kept in fp32 as
transformers (`_keep_in_fp32_modules_strict`) and SGLang keep them."""
import json

import pytest
import torch
from safetensors.torch import save_file

from toolkit.infer.config import ModelConfig
from toolkit.infer.drafts import random_head
from toolkit.infer.eagle2 import Eagle2Head
from toolkit.infer.loading import load_target
from toolkit.infer.model import Transformer, rope_cos_sin
from toolkit.infer.mtp import MTPHead

C = ModelConfig(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=5, num_heads=4,
                num_kv_heads=2, head_dim=8, rope_theta=500000.0)


@pytest.mark.parametrize("kind", ["target", "eagle3", "eagle", "mtp"])
def test_rope_tables_stay_float32_in_a_bf16_model(kind):
    model = {"target": lambda: Transformer(C), "eagle3": lambda: random_head(C, list(range(0, 64, 2))),
             "eagle": lambda: Eagle2Head(C, torch.randn(64, 32)), "mtp": lambda: MTPHead(C, torch.randn(64, 32))}[kind]()
    want = C.inv_freq()
    model = model.to(dtype=torch.bfloat16)
    assert model.inv_freq.dtype == torch.float32 and torch.equal(model.inv_freq, want)
    assert next(p for n, p in model.named_parameters() if n.endswith("norm.weight")).dtype == torch.bfloat16
    model = model.half().float().to(torch.bfloat16)  # any chain of moves
    assert torch.equal(model.inv_freq, want)
    pos = torch.tensor([[4000]])
    cos = rope_cos_sin(pos, model.inv_freq, torch.float32)[0]
    assert torch.equal(cos, rope_cos_sin(pos, want, torch.float32)[0])
    rounded = rope_cos_sin(pos, want.bfloat16(), torch.float32)[0]
    assert (rounded - cos).abs().max() > 1e-3  # what a cast table would have given


def test_deepseek_router_keeps_fp32_weight_and_bias_and_routes_as_in_fp32(tmp_path):
    """A router bias riding on a common offset (~3.0, as trained DeepSeek-V3 biases do): rounded to bf16 (steps
    of 1/64 there) it re-routes a fifth of the tokens; loaded in bf16 the target must route as in fp32."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    from toolkit.infer.deepseek import Router

    torch.manual_seed(0)
    cfg = DeepseekV3Config(vocab_size=100, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1,
                           n_routed_experts=64, num_experts_per_tok=8, n_group=8, topk_group=4,
                           first_k_dense_replace=1, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8,
                           v_head_dim=12, max_position_embeddings=256, q_lora_rank=24)
    model = DeepseekV3ForCausalLM(cfg).eval()
    gate = model.model.layers[1].mlp.gate
    with torch.no_grad():
        gate.weight.normal_(0, 0.5)
        gate.e_score_correction_bias.copy_(torch.randn(64) * 0.05 + 3.0)
    model.save_pretrained(tmp_path)
    target = load_target(tmp_path, dtype=torch.bfloat16)
    router = target.layers[1].mlp.gate
    assert router.weight.dtype == router.e_score_correction_bias.dtype == torch.float32
    assert torch.equal(router.e_score_correction_bias, gate.e_score_correction_bias)
    assert torch.equal(router.weight, gate.weight.detach())
    assert target.layers[1].mlp.experts[0].gate_proj.weight.dtype == torch.bfloat16  # the rest is bf16
    x = torch.randn(2000, 64).bfloat16()
    ids = router(x)[0].sort(-1).values
    rounded = Router(target.config)
    rounded.weight.data = gate.weight.detach().bfloat16().float()
    rounded.e_score_correction_bias = gate.e_score_correction_bias.bfloat16().float()
    assert (rounded(x)[0].sort(-1).values != ids).any(-1).float().mean() > 0.05  # the fix matters here
    want = Router(target.config)
    want.weight.data, want.e_score_correction_bias = gate.weight.detach().clone(), gate.e_score_correction_bias.clone()
    assert torch.equal(want(x)[0].sort(-1).values, ids)


def test_a_router_stored_in_bf16_is_read_into_fp32(tmp_path):
    """Checkpoints that store the router in bf16 (DeepSeek-V3's gate.weight) are upcast, not kept in bf16."""
    from toolkit.infer.config import ModelConfig as MC

    cfg = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 50,
           "hidden_size": 32, "intermediate_size": 48, "moe_intermediate_size": 16, "num_hidden_layers": 2,
           "num_attention_heads": 2, "num_key_value_heads": 2, "n_shared_experts": 1, "n_routed_experts": 4,
           "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1, "kv_lora_rank": 8,
           "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "q_lora_rank": None,
           "max_position_embeddings": 64, "tie_word_embeddings": False}
    torch.manual_seed(0)
    body = Transformer(MC.from_hf(cfg))
    w = {("" if k == "lm_head.weight" else "model.") + k: v.detach().bfloat16().contiguous()
         for k, v in body.state_dict().items()}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    save_file(w, str(tmp_path / "model.safetensors"))
    router = load_target(tmp_path, dtype=torch.bfloat16).layers[1].mlp.gate
    assert router.weight.dtype == router.e_score_correction_bias.dtype == torch.float32
    assert torch.equal(router.weight, w["model.layers.1.mlp.gate.weight"].float())
