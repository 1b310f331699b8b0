"""Launches per engine step, counted for kernels/aot.py: the torch ops a step dispatches that each launch at
least one device kernel (a dispatch mode over meta tensors), and the per-step totals scaled from a 2-layer and a
1-layer drive to the whole model."""
from __future__ import annotations


FREE_OPS = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "detach", "lift_fresh",
            "alias", "_unsafe_view", "set_", "_reshape_alias", "is_same_size", "sym_size", "sym_stride"}


def torch_kernel_counter(label: list, counts: dict):
    """A dispatch mode counting, per step label, the torch ops that would each launch at least one device kernel
    (not views, not allocations): the part of a step the Triton launches do not show."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if label[0] is not None and not func.is_view and name not in FREE_OPS:
                step = counts.setdefault(label[0], {"triton": 0, "torch": 0, "torch_ops": {}})
                step["torch"] += 1
                step["torch_ops"][name] = step["torch_ops"].get(name, 0) + 1
            return func(*args, **(kwargs or {}))

    return Count()


def per_step(counts: dict, one_layer: dict, num_layers: int) -> dict:
    """Launch counts per step for the whole model, from a drive with 2 target layers (`counts`) and one with 1:
    a target step's counts are its fixed part plus num_layers x the per-layer part; plus "draft step in a greedy
    chain" per head kind, (chain of 8 - chain of 2) / 6, the figure bench_gpu times (the loop's fixed costs
    cancel)."""
    out = {}
    for step, c in counts.items():
        if step in one_layer and not step.startswith(("eagle3", "eagle2", "mtp")):
            o = one_layer[step]
            ops = {k: o["torch_ops"].get(k, 0) + (num_layers - 1) * (v - o["torch_ops"].get(k, 0))
                   for k, v in c["torch_ops"].items()}
            c = {k: o[k] + (num_layers - 1) * (c[k] - o[k]) for k in ("triton", "torch")} | {"torch_ops": ops}
            step = f"{step} ({num_layers} layers)"
        out[step] = c
    for kind in ("eagle3", "eagle2", "mtp"):
        a, b = counts.get(f"{kind} greedy chain of 2"), counts.get(f"{kind} greedy chain of 8")
        if not (a and b):
            continue
        out[f"{kind} draft step in a greedy chain"] = {
            "triton": (b["triton"] - a["triton"]) / 6, "torch": (b["torch"] - a["torch"]) / 6,
            "torch_ops": {k: (v - a["torch_ops"].get(k, 0)) / 6 for k, v in b["torch_ops"].items()
                          if v != a["torch_ops"].get(k, 0)}}
    return out
