"""A tiny random GPT-OSS that transformers builds and saves (its hub names), with random norms, biases and sinks
and routers peaked enough that tokens part ways over the experts: the target of the GPT-OSS tests."""
import torch

V = 211


def tiny_gpt_oss(folder, **extra):
    import transformers

    cfg = dict(vocab_size=V, hidden_size=64, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, num_local_experts=6, num_experts_per_tok=2, sliding_window=8,
               max_position_embeddings=131072, bos_token_id=0, eos_token_id=1)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.GptOssConfig(**{**cfg, **extra}),
                                                          dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias") or name.endswith("sinks"):
                p.normal_(1.0 if "norm" in name else 0.0, 0.5 if name.endswith("sinks") else 0.2)
            elif name.endswith("router.weight"):
                p.normal_(0.0, 0.5)
            elif ".experts." in name:
                p.normal_(0.0, 0.3)
        model.lm_head.weight.normal_(0.0, 1.0)
    model.save_pretrained(folder)
    return model
