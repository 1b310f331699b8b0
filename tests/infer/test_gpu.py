"""CUDA-only checks (skipped without a GPU): real CUDA graphs replay exactly what the eager engine computes,
the compiled Triton kernels give the engine the same tokens as torch's, and bf16 runs on the GPU.
The targets are tiny random Llamas written here, so no model download is needed on a GPU machine."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("TRITON_INTERPRET=1 runs Triton on the CPU; unset it for the GPU checks", allow_module_level=True)

from toolkit.infer.drafts import random_head  # noqa: E402
from toolkit.infer.engine import Engine  # noqa: E402
from toolkit.infer.loading import load_target  # noqa: E402
from toolkit.infer.sampling import SamplingParams  # noqa: E402
from toolkit.infer.tree import TreeConfig  # noqa: E402

PROMPTS = [[1, 504, 3575, 282, 19], [1, 88, 9], [1, 4000, 17, 2201, 77, 301, 5, 6, 7]]
TREES = [None, TreeConfig(4, 1, 5), TreeConfig(3, 3, 8)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    out = tmp_path_factory.mktemp("gpu-target")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=8192, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # a peaked next-token distribution, so greedy choices are far from ties
        model.lm_head.weight.normal_(0.0, 1.0)
    model.save_pretrained(out)
    return out


def run(target, tree, **kw):
    head = None if tree is None else random_head(target.config, seed=1).to(target.embed_tokens.weight)
    engine = Engine(target, head, tree, max_len=64, max_batch=4, **kw)
    return engine.generate_batch(PROMPTS, SamplingParams(max_new_tokens=12))


@pytest.mark.parametrize("tree", TREES, ids=["plain", "chain", "tree"])
def test_cuda_graphs_equal_eager(folder, tree):
    gpu = load_target(folder, torch.float32, "cuda")
    want, got = run(gpu, tree, cuda_graphs=False), run(gpu, tree, cuda_graphs=True)
    assert [r.tokens for r in got] == [r.tokens for r in want]
    assert [r.accepted for r in got] == [r.accepted for r in want]


@pytest.mark.parametrize("tree", TREES[1:], ids=["chain", "tree"])
def test_triton_kernels_give_the_engine_the_same_tokens(folder, tree):
    gpu = load_target(folder, torch.float32, "cuda")
    want = run(gpu, tree, cuda_graphs=True)
    gpu.set_kernels("triton")
    for graphs in (False, True):
        got = run(gpu, tree, cuda_graphs=graphs)
        assert [r.tokens for r in got] == [r.tokens for r in want]


@pytest.mark.parametrize("kernels", ["torch", "triton"])
def test_bf16_speculation_on_the_gpu_equals_plain_bf16_decoding(folder, kernels):
    """The lossless claim in the dtype the GPU runs: greedy with a tree equals plain greedy, both graphed."""
    gpu = load_target(folder, torch.bfloat16, "cuda").set_kernels(kernels)
    plain, spec = run(gpu, None), run(gpu, TREES[2])
    assert [r.tokens for r in spec] == [r.tokens for r in plain]


def test_sampled_speculation_runs_on_the_gpu_and_a_seed_reproduces_it(folder):
    """Sampling on CUDA (verify's rejection sampling, the bonus token) with a generator on the device, as
    `toolkit bench --temperature 1` and `toolkit serve` build it: a CPU generator would be refused there."""
    from toolkit.infer.sampling import seeded_generator

    gpu = load_target(folder, torch.bfloat16, "cuda").set_kernels("triton")
    head = random_head(gpu.config, seed=1).to(gpu.embed_tokens.weight)
    engine = Engine(gpu, head, TREES[2], max_len=64, max_batch=4)
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_new_tokens=16)
    runs = [engine.generate_batch(PROMPTS, params, generator=seeded_generator("cuda", 7)) for _ in range(2)]
    assert [r.tokens for r in runs[0]] == [r.tokens for r in runs[1]]
    assert all(len(r.tokens) == 16 for r in runs[0])


def test_a_sampled_chain_on_the_gpu_replays_from_graphs_what_eager_draws(folder):
    """--sample-draft on CUDA: the noise comes from a device generator; the graphed draft loop (noise and 1 / T as
    inputs) and the eager one draw and accept the same tokens from the same seed."""
    from toolkit.infer.sampling import seeded_generator

    gpu = load_target(folder, torch.float32, "cuda")
    head = random_head(gpu.config, seed=1).to(gpu.embed_tokens.weight)
    params = SamplingParams(temperature=0.8, max_new_tokens=16)
    runs = [Engine(gpu, head, TREES[1], max_len=64, max_batch=4, cuda_graphs=graphs, sample_draft=True)
            .generate_batch(PROMPTS, params, generator=seeded_generator("cuda", 3)) for graphs in (False, True)]
    assert [r.tokens for r in runs[1]] == [r.tokens for r in runs[0]]
    assert [r.accepted for r in runs[1]] == [r.accepted for r in runs[0]]
