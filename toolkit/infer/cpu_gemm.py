"""A vocabulary projection's few-row fp32 GEMMs on a CPU, from a copy of its weight packed for oneDNN.

Why: inference keeps an fp32 readout weight in in_out_storage ([in, out] storage), the layout CPU BLAS streams a
1-row GEMV fastest from (a plain decode step). From 2 rows on (a verify step's tree tokens, a tree draft's top-k
rows, a batch's decode step) MKL's GEMMs on that layout, or on [out, in], run far below the weights' bandwidth on
the AMD box: SmolLM2's 49,152 x 576 readout takes 5 ms for 1 row and 30 ms for 8, where oneDNN's kernel over a
weight reordered into its blocked layout takes 13 ms (1 thread; benchmarks/RESULTS.md). So a packed readout keeps
both: the [in, out] weight for one row, the packed copy for more; the copy costs the readout's size once more in
memory (SmolLM2: 113 MB beside 540 MB of weights).

`pack(linear)` (prepare.readout_layout: inference only) makes an nn.Linear a PackedReadout: the same parameters and
state dict, a forward that reads two rows or more from the copy. The copy is made again, at the next such call,
when the weight it was made from is no longer the weight held (another tensor, shape, dtype or device, or written
in place since: its version counter), and dropped by a move (.to / .float / ...) and by copy.deepcopy / torch.save
(an opaque oneDNN tensor can be neither). Not seen: a write through `weight.data`, which has a version counter of its
own. No gradient flows through the copy: a weight or input that wants one reads the weight. Shapes: x [..., H] ->
[..., V].
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

ROWS_HINT = 8  # the row count oneDNN's packed layout is chosen for (1-16 rows time alike on the box)


def packable(w: torch.Tensor) -> bool:
    return w.device.type == "cpu" and w.dtype == torch.float32 and w.dim() == 2 and torch.backends.mkldnn.is_available()


def source(w: torch.Tensor) -> tuple:
    """What a copy of w was made from: storage, layout, and in-place version (none for an inference tensor, which
    keeps no version counter and cannot be written outside inference mode)."""
    return (w.data_ptr(), w.storage_offset(), tuple(w.shape), w.stride(), w.dtype, w.device,
            None if w.is_inference() else w._version)


def packed_copy(w: torch.Tensor) -> tuple:
    """(source(w), w reordered into oneDNN's blocked layout for ROWS_HINT-row GEMMs)."""
    return source(w), torch.ops.mkldnn._reorder_linear_weight(w.detach(), ROWS_HINT)


class PackedReadout(nn.Linear):
    """nn.Linear whose several-row calls read `packed` = (source(weight), oneDNN's copy), made by pack()."""

    packed = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() == x.shape[-1] or x.dtype != torch.float32 or torch.compiler.is_compiling() \
                or (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)) \
                or not packable(self.weight):  # one row; or inductor packs its own (compiled_decode.py); autograd
            return F.linear(x, self.weight, self.bias)
        if self.packed is None or self.packed[0] != source(self.weight):
            self.packed = packed_copy(self.weight)
        flat = x.reshape(-1, x.shape[-1]).contiguous()                                          # [n, H]
        out = torch.ops.mkldnn._linear_pointwise(flat, self.packed[1], self.bias, "none", [], "")  # [n, V]
        # shaped as x without becoming a view (as F.linear's output is not: a CUDA-graph stand-in copies into it)
        return torch.ops.aten._unsafe_view(out, (*x.shape[:-1], out.shape[-1]))

    def _apply(self, fn, recurse=True):
        self.packed = None  # of the weight before the move: made again from the moved one when it is CPU fp32
        return super()._apply(fn, recurse)

    def __getstate__(self):
        return {**super().__getstate__(), "packed": None}  # copy.deepcopy, torch.save: made again when needed


def pack(linear: nn.Linear) -> None:
    """Make `linear` a PackedReadout and its copy now, where the weight is a CPU fp32 one (else at the first
    several-row call that finds one)."""
    if not isinstance(linear, PackedReadout):
        linear.__class__ = PackedReadout  # the same module: parameters, hooks and state dict unchanged
    linear.packed = packed_copy(linear.weight) if packable(linear.weight) else None
