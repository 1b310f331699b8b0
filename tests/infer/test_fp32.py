"""Tensors that stay float32 when a model or a draft head is moved to bf16 (toolkit/infer/fp32.py): RoPE's
inverse frequencies in every draft kind and the target (a bf16 inv_freq puts a draft's rotations ~0.4 rad away
from the target's at position 4,000), and DeepSeek-V3's router weight and correction bias, kept in fp32 as
transformers (`_keep_in_fp32_modules_strict`) and SGLang keep them."""
import json

import pytest
import torch
from safetensors.torch import save_file

from toolkit.infer.attention import rope_cos_sin
from toolkit.infer.config import ModelConfig
from toolkit.infer.drafts import random_head
from toolkit.infer.eagle2 import Eagle2Head
from toolkit.infer.loading import load_target
from toolkit.infer.model import Transformer
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

    from toolkit.infer.moe import GroupedSigmoidRouter as Router

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


def _bf16_llama(seed=0):
    torch.manual_seed(seed)
    return Transformer(C).to(torch.bfloat16).eval().fuse()


def test_fp32_readout_sums_the_bf16_operands_in_fp32_on_every_path():
    """Logits of a bf16 model with fp32_readout: fp32, the bf16 normed state times the bf16 rows summed in fp32,
    through the prefill (logits_at), a cached decode step and the compiled step's function (eagerly here)."""
    from toolkit.infer.compiled_decode import decode_step
    from toolkit.infer.kv_cache import KVCache

    model = _bf16_llama()
    ids = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(1))
    plain, (normed,) = model(ids, aux_layers=[-1])
    assert plain.dtype == torch.bfloat16 and model.lm_head_fp32 is None
    model.fp32_readout()
    want = torch.nn.functional.linear(normed.float(), model.lm_head.weight.float())  # [1, 12, V]
    got, _ = model(ids)
    assert got.dtype == torch.float32 and (got - want).abs().max() <= 1e-5
    assert (plain.float() - want).abs().max() > 1e-3  # what bf16 logits round away
    cache = KVCache(C, 1, 32, torch.bfloat16)
    first, _ = model(ids[:, :11], cache=cache, logits_at=torch.tensor([10]))  # a prefill's last position only
    assert first.dtype == torch.float32 and (first[0, 0] - want[0, 10]).abs().max() <= 1e-5
    pos = torch.tensor([[11]])
    step, _ = model(ids[:, 11:], pos, cache=cache)
    assert step.dtype == torch.float32 and (step[0, 0] - want[0, 11]).abs().max() <= 1e-5
    keys, values = [cache.k[i, :1] for i in range(C.num_layers)], [cache.v[i, :1] for i in range(C.num_layers)]
    again, _ = decode_step(model, ids[:, 11:], pos, pos[0], 12, None, keys, values)
    assert again.dtype == torch.float32 and (again[0, 0] - want[0, 11]).abs().max() <= 1e-5
    model.fp32_readout(False)
    assert model(ids)[0].dtype == torch.bfloat16 and model.lm_head_fp32 is None


def test_fp32_readout_parts_a_bf16_tie_that_argmax_would_break_by_index():
    """Two vocabulary rows one bf16 step apart in one weight: their bf16 logits round to the same value (argmax
    takes the lower id), their fp32 logits do not (the larger wins), as SGLang's --enable-fp32-lm-head gives."""
    model = _bf16_llama()
    ids = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(2))
    _, (normed,) = model(ids, aux_layers=[-1])
    h = normed[0, -1]                                                                # [H] bf16
    j = int(h.float().abs().argsort()[len(h) // 2])  # a middling element: a small nudge of the logit
    with torch.no_grad():
        w = model.lm_head.weight
        w[3] = (h.float() * 8 / h.float().norm()).bfloat16()  # rows 3 and 7: the largest logits by far
        w[7] = w[3]
        up = torch.nextafter(w[3, j].float(), torch.tensor(float("inf") if h[j] > 0 else float("-inf")))
        w[7, j] = up.bfloat16() if up.bfloat16() != w[3, j] else (w[3, j].float() * (1 + 2 ** -7)).bfloat16()
    low = model(ids)[0][0, -1]
    assert low[3] == low[7] and int(low.argmax()) == 3
    high = model.fp32_readout()(ids)[0][0, -1]
    assert high[7] > high[3] and int(high.argmax()) == 7


def test_the_fp32_copy_follows_moves_and_loads_and_stays_out_of_the_state_dict():
    """The copy is made again from the weight as it is after a move or a load_state_dict (not carried stale), stays
    fp32, and is not saved; a wish made while the model is fp32 takes effect once it is bf16."""
    model = _bf16_llama().fp32_readout()
    assert model.lm_head_fp32.dtype == torch.float32 and torch.equal(model.lm_head_fp32, model.lm_head.weight.float())
    model = model.to(torch.float16).to(torch.bfloat16)
    assert model.lm_head_fp32.dtype == torch.float32 and torch.equal(model.lm_head_fp32, model.lm_head.weight.float())
    assert "lm_head_fp32" not in model.state_dict()
    other = _bf16_llama(seed=1).state_dict()
    assert not torch.equal(other["lm_head.weight"], model.lm_head.weight)
    model.load_state_dict(other)
    assert torch.equal(model.lm_head_fp32, other["lm_head.weight"].float())
    ids = torch.randint(0, 64, (1, 5), generator=torch.Generator().manual_seed(3))
    _, (normed,) = model(ids, aux_layers=[-1])
    want = torch.nn.functional.linear(normed.float(), other["lm_head.weight"].float())
    assert (model(ids)[0] - want).abs().max() <= 1e-5
    fp32 = Transformer(C).eval().fuse().fp32_readout()  # an fp32 model: nothing to do yet
    assert fp32.logits_fp32 is False and fp32.lm_head_fp32 is None
    fp32.bfloat16()
    assert fp32.logits_fp32 and fp32(ids)[0].dtype == torch.float32
    fp32.fp32_readout(False).float().bfloat16()
    assert not fp32.logits_fp32 and fp32(ids)[0].dtype == torch.bfloat16


def test_fp32_logits_without_a_copy_off_cuda_casts_the_weight():
    """A bf16 weight off CUDA with no copy (one made for another device) still gives the fp32 sums: CPU has no
    torch.mm(out_dtype=fp32)."""
    from toolkit.infer.fp32 import fp32_logits

    g = torch.Generator().manual_seed(4)
    x, w = torch.randn(2, 3, 16, generator=g).bfloat16(), torch.randn(40, 16, generator=g).bfloat16()
    got = fp32_logits(x, w, None)
    assert got.dtype == torch.float32 and got.shape == (2, 3, 40)
    assert (got - torch.nn.functional.linear(x.float(), w.float())).abs().max() <= 1e-5


def test_load_reads_fp32_lm_head_for_a_bf16_target(smollm2_dir):
    from toolkit.infer.loading import load

    loaded = load(None, str(smollm2_dir), None, "cpu", "bfloat16", "torch", fp32_lm_head=True)
    assert loaded.target.logits_fp32 and loaded.target.lm_head_fp32.shape == (49152, 576)
    logits, _ = loaded.target(torch.tensor([[1, 2, 3]]))
    assert logits.dtype == torch.float32


def test_fp32_lm_head_on_an_fp32_target_says_it_does_nothing(smollm2_dir, capsys):
    from toolkit.infer.loading import load

    loaded = load(None, str(smollm2_dir), None, "cpu", "float32", "torch", fp32_lm_head=True)
    assert not loaded.target.logits_fp32 and "runs in float32 already" in capsys.readouterr().err


def test_cpu_weight_layout_follows_the_dtype():
    """On CPU the fused projections and the readout are stored [in, out] for fp32 (its GEMVs ~2x faster there)
    and left [out, in] for bf16, whose GEMMs run 1.1-2.5x faster that way (prepare.in_out_storage)."""
    for dtype, transposed in ((torch.float32, True), (torch.bfloat16, False)):
        torch.manual_seed(0)
        model = Transformer(C).to(dtype).eval().fuse()
        for w in (model.lm_head.weight, model.layers[0].self_attn.qkv, model.layers[0].mlp.gate_up):
            assert w.dtype == dtype and w.t().is_contiguous() is transposed and w.is_contiguous() is not transposed
        if dtype == torch.bfloat16:  # the fp32 copy of a bf16 readout is an fp32 weight: [in, out]
            assert model.fp32_readout().lm_head_fp32.t().is_contiguous()
