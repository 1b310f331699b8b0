"""GPT-OSS's attention sinks on the fused Triton kernels: the tree-attention kernel with sinks equals its torch
reference (one split and several, a row that sees nothing), and a GPT-OSS target decodes the tokens transformers'
`generate` gives, plain and speculative. On CPU under TRITON_INTERPRET=1, compiled on a GPU."""
import os
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():  # before the kernel modules are imported: without a GPU, interpret the kernels
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

device = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"


@pytest.mark.parametrize("splits", [1, 3])
def test_tree_attention_with_sinks_matches_the_reference(splits):
    from toolkit.infer.kernels.tree_attention import reference_attention, tree_attention

    g = torch.Generator().manual_seed(splits)
    B, HQ, HKV, T, S, D = 2, 8, 2, 5, 70, 32
    q = torch.randn(B, HQ, T, D, generator=g).to(device)
    k, v = (torch.randn(B, HKV, S, D, generator=g).to(device) for _ in range(2))
    sinks = (torch.randn(HQ, generator=g) * 2).to(device)
    mask = torch.rand(B, T, S, generator=g).to(device) < 0.7
    mask[1, 3] = False  # sees nothing: its whole weight on the sink, output zero
    got = tree_attention(q, k, v, mask, splits=splits, sinks=sinks)
    assert (got - reference_attention(q, k, v, mask, sinks=sinks)).abs().max() < 1e-4
    assert (got - reference_attention(q, k, v, mask)).abs().max() > 1e-2  # the sinks change the result
    with pytest.raises(ValueError, match="sinks shape"):
        tree_attention(q, k, v, mask, sinks=sinks[:4])


def test_a_gpt_oss_target_decodes_the_same_tokens_on_the_triton_kernels(tmp_path):
    sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/infer: the tiny GPT-OSS writer
    from gpt_oss_model import tiny_gpt_oss
    from hf_reference import PROMPTS, generate_tokens

    from toolkit.infer.drafts import random_head
    from toolkit.infer.engine import Engine
    from toolkit.infer.loading import load_target
    from toolkit.infer.sampling import SamplingParams
    from toolkit.infer.tree import TreeConfig

    hf = tiny_gpt_oss(tmp_path)
    want = generate_tokens(hf, 10)  # 16 positions past a window of 8
    target = load_target(tmp_path, device=device).set_kernels("triton")
    head = random_head(target.config, seed=1).to(device)
    for d, tree in ((None, TreeConfig()), (head, TreeConfig(2, 2, 4))):
        got = Engine(target, d, tree, max_len=40, max_batch=2, cuda_graphs=False).generate_batch(
            PROMPTS, SamplingParams(max_new_tokens=10), stop_ids={1})
        assert [r.tokens for r in got] == want, tree
