"""A MoE target (Qwen2-MoE: qkv biases, routed experts and the gated shared expert) on the fused Triton kernels:
attention over the cache with the tree mask, RMSNorm + residual, RoPE + cache write and every expert's SiLU-mul
give the tokens the torch kernels give, plain and speculative. On CPU under TRITON_INTERPRET=1, compiled on a GPU."""
import os

import pytest
import torch

if not torch.cuda.is_available():  # before the kernel modules are imported: without a GPU, interpret the kernels
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

device = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"


def test_a_moe_target_decodes_the_same_tokens_on_the_triton_kernels(tmp_path, monkeypatch):
    import transformers

    import toolkit.infer.kernels.layer_ops as layer_ops
    from toolkit.infer.drafts import random_head
    from toolkit.infer.engine import Engine
    from toolkit.infer.loading import load_target
    from toolkit.infer.sampling import SamplingParams
    from toolkit.infer.tree import TreeConfig

    cfg = transformers.Qwen2MoeConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, num_experts=4,
                                      num_experts_per_tok=2, moe_intermediate_size=32,
                                      shared_expert_intermediate_size=48, bos_token_id=0, eos_token_id=1)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 1.0)
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0.0, 0.5)
    model.save_pretrained(tmp_path)
    prompts, p = [[5, 17, 33, 8, 61], [9, 4]], SamplingParams(max_new_tokens=8)
    calls, real = [], layer_ops.silu_mul
    monkeypatch.setattr(layer_ops, "silu_mul", lambda x: calls.append(x.shape[0]) or real(x))
    runs = {}
    for kernels in ("torch", "triton"):
        target = load_target(tmp_path, device=device).set_kernels(kernels)
        head = random_head(target.config, seed=1).to(device)
        runs[kernels] = [[r.tokens for r in Engine(target, d, tree, max_len=40, max_batch=2, cuda_graphs=False)
                          .generate_batch(prompts, p, stop_ids={1})]
                         for d, tree in ((None, TreeConfig()), (head, TreeConfig(2, 2, 4)))]
        assert bool(calls) == (kernels == "triton")  # the experts' SiLU-mul ran in Triton
    assert runs["triton"] == runs["torch"] and runs["torch"][0] == runs["torch"][1]
