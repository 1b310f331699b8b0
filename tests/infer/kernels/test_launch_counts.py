"""kernels/launch_counts.py: the dispatch mode counts the ops that launch kernels (not views, not allocations)
under the step label only, and per_step scales a 2-layer drive to the whole model and takes a chain's draft step
as the difference of two chains, exactly."""
from __future__ import annotations

import torch

from toolkit.infer.kernels.launch_counts import per_step, torch_kernel_counter


def test_counter_counts_kernel_ops_under_a_label_only():
    label, counts = [None], {}
    x = torch.ones(4, 4)
    with torch_kernel_counter(label, counts):
        torch.mm(x, x)  # no label: the harness's own setup, not counted
        label[0] = "step"
        y = torch.mm(x, x)
        y = y.view(16)  # a view launches nothing
        torch.empty(3)  # nor does an allocation
        torch.add(y, 1)
        torch.mm(x, x)
        label[0] = None
    assert counts == {"step": {"triton": 0, "torch": 3, "torch_ops": {"mm": 2, "add": 1}}}


def test_per_step_scales_layers_and_differences_chains():
    def c(triton, torch_, **ops):
        return {"triton": triton, "torch": torch_, "torch_ops": ops}

    two = {"decode": c(12, 5, mm=3, embedding=1, add=1),
           "eagle3 greedy chain of 2": c(20, 4, topk=4), "eagle3 greedy chain of 8": c(68, 16, topk=16)}
    one = {"decode": c(7, 4, mm=2, embedding=1, add=1)}
    out = per_step(two, one, num_layers=32)
    # fixed part + 32 x per-layer part: triton 7 + 31 * 5, torch 4 + 31 * 1, mm 2 + 31 * 1
    assert out["decode (32 layers)"] == c(162, 35, mm=33, embedding=1, add=1)
    assert out["eagle3 draft step in a greedy chain"] == c(8.0, 2.0, topk=2.0)
    assert out["eagle3 greedy chain of 8"] == two["eagle3 greedy chain of 8"]  # heads' steps kept as driven
    assert "eagle2 draft step in a greedy chain" not in out  # a kind not driven gives no row
