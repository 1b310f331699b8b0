"""A vocabulary projection's few-row fp32 GEMMs on a CPU, from a copy of its weight packed once for oneDNN.

Why: inference keeps an fp32 readout weight in in_out_storage ([in, out] storage), the layout CPU BLAS streams a
1-row GEMV fastest from (a plain decode step). From 2 rows on (a verify step's tree tokens, a tree draft's top-k
rows, a batch's decode step) MKL's GEMMs on that layout, or on [out, in], run far below the weights' bandwidth on
the AMD box: SmolLM2's 49,152 x 576 readout takes 6.2 ms for 1 row and 32 ms for 8, where oneDNN's kernel over a
weight reordered into its blocked layout takes 13 ms (1 thread; benchmarks/RESULTS.md). So a packed readout keeps
both: the [in, out] weight for one row, the packed copy for more; the copy costs the readout's size once more in
memory (SmolLM2: 113 MB beside 540 MB of weights).

`pack(linear)` attaches the copy (CPU fp32 weights only, where oneDNN is built in); `linear_rows(linear, x)` is
linear(x), from the copy when x holds several rows and the copy is of the weight linear holds now (same storage,
no in-place write since: a moved, cast or reloaded weight falls back to F.linear). Inference only: the copy has no
gradient. Shapes: x [..., H] -> [..., V].
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

ROWS_HINT = 8  # the row count oneDNN's packed layout is chosen for (1-16 rows time alike on the box)


class Packed:
    """A weight's oneDNN-packed copy, and which tensor, at which in-place version, it was made from."""

    def __init__(self, w: torch.Tensor):
        self.source = (w.data_ptr(), w._version)
        self.weight = torch.ops.mkldnn._reorder_linear_weight(w.detach(), ROWS_HINT)

    def of(self, w: torch.Tensor) -> bool:
        return (w.data_ptr(), w._version) == self.source


def packable(w: torch.Tensor) -> bool:
    return w.device.type == "cpu" and w.dtype == torch.float32 and w.dim() == 2 and torch.backends.mkldnn.is_available()


def pack(linear: nn.Linear) -> None:
    """Attach a packed copy of linear's weight for linear_rows (nothing where the weight is not a CPU fp32 one)."""
    linear.packed = Packed(linear.weight) if packable(linear.weight) else None


def linear_rows(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """linear(x): from the packed copy for two rows or more (fresh, and no gradient wanted), else linear's own."""
    packed = getattr(linear, "packed", None)  # (not under torch.compile: inductor packs its own, compiled_decode.py)
    if packed is not None and x.numel() > x.shape[-1] and x.dtype == torch.float32 and packed.of(linear.weight) \
            and not torch.compiler.is_compiling() and not (torch.is_grad_enabled() and linear.weight.requires_grad):
        flat = x.reshape(-1, x.shape[-1]).contiguous()                                   # [n, H]
        out = torch.ops.mkldnn._linear_pointwise(flat, packed.weight, linear.bias, "none", [], "")  # [n, V]
        # shaped as x without becoming a view (as F.linear's output is not: a CUDA-graph stand-in copies into it)
        return torch.ops.aten._unsafe_view(out, (*x.shape[:-1], out.shape[-1]))
    return F.linear(x, linear.weight, linear.bias)
