"""Sliding-window attention on the fused Triton kernels (the tree-attention kernel reading the window in its mask,
the GEMV layer for few rows): past the window a Mistral decodes the tokens the torch kernels give, plain and
speculative. On CPU under TRITON_INTERPRET=1, compiled on a GPU."""
import os

import pytest
import torch

if not torch.cuda.is_available():  # before the kernel modules are imported: without a GPU, interpret the kernels
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

device = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"


def test_a_windowed_target_decodes_the_same_tokens_on_the_triton_kernels(tmp_path):
    import transformers

    from toolkit.infer.drafts import random_head
    from toolkit.infer.engine import Engine
    from toolkit.infer.loading import load_target
    from toolkit.infer.sampling import SamplingParams
    from toolkit.infer.tree import TreeConfig

    cfg = transformers.MistralConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, sliding_window=6,
                                     bos_token_id=0, eos_token_id=1)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 1.0)
    model.save_pretrained(tmp_path)
    prompts, p = [[5, 17, 33, 8, 61, 7, 22, 40], [9, 4]], SamplingParams(max_new_tokens=8)
    want = [model.generate(torch.tensor([q]), max_new_tokens=8, do_sample=False, pad_token_id=0)[0, len(q):]
            .tolist() for q in prompts]
    target = load_target(tmp_path, device=device).set_kernels("triton")
    head = random_head(target.config, seed=1).to(device)
    for d, tree in ((None, TreeConfig()), (head, TreeConfig(2, 2, 4))):
        got = Engine(target, d, tree, max_len=40, max_batch=2, cuda_graphs=False).generate_batch(prompts, p,
                                                                                               stop_ids={1})
        assert [r.tokens for r in got] == want, tree
