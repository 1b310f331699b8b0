"""Preparing a model (a target or a draft head) for inference: the kernels it runs (apply_kernels), one fused
weight for q/k/v and for gate/up (fuse_projections), and the CPU weight layout (in_out_storage, readout_layout: with
a packed copy of the readout for several rows, cpu_gemm.py).
Transformer.set_kernels / .fuse (load_target: the frozen target of training too) and draft_folder.load_draft call
these; a head in training never meets them."""
from __future__ import annotations

import os

import torch
from torch import nn

from toolkit.infer.attention import Attention
from toolkit.infer.cpu_gemm import pack
from toolkit.infer.model import MLP
from toolkit.infer.norm import RMSNorm


def apply_kernels(module: nn.Module, kernels: str, require_device: bool = True) -> nn.Module:
    """Set `kernels` ("torch" or "triton") on `module` (a target or a draft head) and on its norms, attention
    and MLPs, refusing what cannot run: an unknown name, MLA layers, Triton off CUDA without the interpreter
    (require_device False: kernels/aot.py, whose launches only compile)."""
    if kernels not in ("torch", "triton"):
        raise ValueError(f"kernels {kernels!r}; accepted: torch, triton")
    if kernels == "triton":
        if module.config.mla is not None:
            raise ValueError("--kernels triton covers Llama-family attention; MLA layers (DeepSeek) run with "
                             "--kernels torch")
        if require_device and next(module.parameters()).device.type != "cuda" \
                and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError("--kernels triton needs a CUDA device (or TRITON_INTERPRET=1 on CPU, for tests)")
    module.kernels = kernels
    for m in module.modules():
        if isinstance(m, (RMSNorm, Attention, MLP)):
            m.kernels = kernels
    return module


def fuse_projections(module: nn.Module) -> None:
    """For inference: one weight for q/k/v and one for gate/up in every Attention / MLP of `module` (a target
    or a draft head), so a decode step runs 4 GEMMs per layer instead of 7 (fewer, larger kernels: ~2 ms less
    per plain decode step on CPU), in in_out_storage like the vocabulary projection (readout_layout).
    The separate modules' weights become frozen views of the fused ones, so nothing is stored twice."""
    def join(mods, dst, name):
        fused = in_out_storage(torch.cat([m.weight.detach() for m in mods]))  # 15-35% faster fp32 GEMVs on CPU
        setattr(dst, name, fused)
        start = 0
        for m in mods:
            n = m.weight.shape[0]
            m.weight = nn.Parameter(fused[start:start + n], requires_grad=False)
            start += n

    for m in module.modules():
        if isinstance(m, Attention) and m.qkv is None:  # not DeepSeek's MLA, not fused yet
            join([m.q_proj, m.k_proj, m.v_proj], m, "qkv")
            if m.q_proj.bias is not None:
                m.qkv_b = torch.cat([m.q_proj.bias.detach(), m.k_proj.bias.detach(), m.v_proj.bias.detach()])
        elif isinstance(m, MLP) and m.gate_up is None:  # not a MoE
            join([m.gate_proj, m.up_proj], m, "gate_up")


def in_out_storage(w: torch.Tensor) -> torch.Tensor:
    """On CPU, an fp32 Linear weight [out, in] stored as [in, out] (a transposed view: same shape, same values), the
    layout CPU BLAS streams fp32 decode GEMVs fastest from; unchanged elsewhere. bf16 GEMMs run fastest from
    [out, in] (oneDNN's bf16 kernels; an AVX-512-BF16 EPYC, 1 thread: SmolLM2's 49,152 x 576 readout 3.2 ms
    against 7.9 ms at 1 row, 4.8 against 9.3 at 16; fp32 4.0 against 6.8 the other way round)."""
    return w.t().contiguous().t() if w.device.type == "cpu" and w.dtype == torch.float32 else w


def readout_layout(linear: nn.Linear) -> None:
    """A vocabulary projection in in_out_storage (its fp32 decode GEMV ~2x faster on CPU: 8-10 -> 20 GB/s
    measured), and a PackedReadout: oneDNN's packed copy for steps of several rows (cpu_gemm.py). Inference only:
    the weight is frozen."""
    linear.weight = nn.Parameter(in_out_storage(linear.weight.detach()), requires_grad=False)
    pack(linear)  # and for steps of several rows, oneDNN's packed copy (cpu_gemm.py)
