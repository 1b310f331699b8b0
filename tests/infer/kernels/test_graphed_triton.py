"""The engine's graphed steps on the Triton kernels (graphs.py's buckets through eager_capture, the kernels under
TRITON_INTERPRET=1 on CPU): padding rows and tokens must not widen what the attention reads. Its `lens` bound is
the last slot any of a row's tokens sees; padding that attended the cache's last (scratch) slot made a padded
row, and every real row of a verify padded to a wider bucket, read the whole cache."""
import os

import pytest
import torch

if not torch.cuda.is_available():  # before the kernel modules are imported: without a GPU, interpret the kernels
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

device = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"


@pytest.mark.parametrize("tree", [None, (3, 2, 6)], ids=["lookup-alone", "tree+lookup"])
def test_padding_keeps_the_attention_within_the_sequences(tiny_llama, monkeypatch, tree):
    """Three prompts (a batch padded to the bucket of 4) with a lookup branch (rounds of several widths padded to
    the widest bucket): the same tokens as the eager engine on the same kernels, and no attention call of a
    replayed step reads past the longest real sequence's slots."""
    import toolkit.infer.kernels.tree_attention as ta
    from toolkit.infer.drafts import random_head
    from toolkit.infer.engine import Engine
    from toolkit.infer.graphs import eager_capture
    from toolkit.infer.loading import load_target
    from toolkit.infer.lookup import LookupConfig
    from toolkit.infer.sampling import SamplingParams
    from toolkit.infer.tree import TreeConfig

    target = load_target(tiny_llama, device=device)
    target.set_kernels("triton")
    prompts = [[1, 50, 35, 28, 19] * 3, [1, 88, 9] * 3, [1, 40, 17, 22, 77, 30, 5, 6, 7] * 2]
    params, lookup, max_len = SamplingParams(max_new_tokens=10), LookupConfig(4), 96
    bounds, real = [], ta.tree_attention

    def spy(q, k, v, mask, scale=None, lens=None, **kw):
        bounds.append(int(lens.max()) if lens is not None else k.shape[2])
        return real(q, k, v, mask, scale, lens, **kw)

    monkeypatch.setattr(ta, "tree_attention", spy)
    runs = []
    for graphs in (False, True):
        head = None if tree is None else random_head(target.config, seed=1).to(device)
        engine = Engine(target, head, None if tree is None else TreeConfig(*tree), max_len=max_len, max_batch=4,
                        cuda_graphs=graphs, graph_capture=eager_capture if graphs else None, lookup=lookup)
        bounds.clear()  # the capture attends to the scratch slot on purpose
        runs.append(engine.generate_batch(prompts, params))
    assert [r.tokens for r in runs[1]] == [r.tokens for r in runs[0]]
    assert [r.accepted for r in runs[1]] == [r.accepted for r in runs[0]]
    longest = max(len(p) for p in prompts) + params.max_new_tokens + 16  # a round's tree and lookup nodes
    assert bounds and max(bounds) <= longest < max_len - 1, (max(bounds), longest)
