"""A module's tensors that stay float32 whatever dtype the module is moved to.

nn.Module.to(dtype) / .bfloat16() / .half() cast every floating tensor. Two must not be: RoPE's inverse
frequencies (bf16 keeps 8 bits of each, so the angle at position 4,000 is off by up to ~0.4 rad, and a draft's
rotations stop matching the target's) and DeepSeek-V3's router (`gate.weight`, `e_score_correction_bias`:
transformers keeps both in fp32 with `_keep_in_fp32_modules_strict`, SGLang too; rounded to bf16 the bias
re-routes tokens to other experts). A subclass names them in `keep_fp32`; a move then follows only the device.

And a bf16 / fp16 model's logits in fp32 (Transformer.fp32_readout; SGLang's --enable-fp32-lm-head): a bf16
logit keeps 8 significant bits, so two tokens within 2^-8 of the larger (0.06-0.125 at a logit of 16-32) tie
exactly and argmax takes the first, and softmax reads probabilities off that grid. fp32 logits have no such ties
and bring sampled distributions nearer the fp32 model's (SmolLM2 over MT-bench answers: mean total variation
0.0143 -> 0.0113). They do not keep greedy speculative text on plain decoding's: a verify step and a decode step
round the bf16 hidden states otherwise, which moves the logits by about a bf16 step anyway (benchmarks/RESULTS.md,
`benchmarks/greedy_divergence.py`).
"""
from __future__ import annotations

import torch
from torch import nn


class KeepsFp32(nn.Module):
    keep_fp32: tuple[str, ...] = ()

    def _apply(self, fn, recurse=True):
        # .data: the tensor as it is now (a parameter's data is swapped in place by the move)
        kept = {n: t.data for n in self.keep_fp32
                if isinstance(t := getattr(self, n, None), torch.Tensor) and t.dtype == torch.float32}
        super()._apply(fn, recurse)
        for n, t in kept.items():
            moved = getattr(self, n)
            if isinstance(moved, nn.Parameter):
                moved.data = t.to(moved.device)
            else:
                self._buffers[n] = t.to(moved.device)
        return self


class Fp32Readout(KeepsFp32):
    """A model whose lm_head may read out in fp32 (fp32_readout). The wish is kept, and what serves it (the copy
    off CUDA, nothing on it) is made again from the weight as it is after every move (.to / .cuda / .bfloat16)
    and load_state_dict: a copy made before would be on the wrong device, of the old weights, or missing."""

    def __init__(self):
        super().__init__()
        self.register_buffer("lm_head_fp32", None, persistent=False)  # fp32_readout's copy, when it makes one
        self.logits_fp32 = self.fp32_wanted = False
        self.register_load_state_dict_post_hook(_fp32_after_load)

    def fp32_readout(self, on: bool = True) -> "Fp32Readout":
        """Logits in fp32 from a bf16 / fp16 model (SGLang's --enable-fp32-lm-head). A no-op while the model is
        fp32; kept for when it is moved to bf16 / fp16."""
        self.fp32_wanted = on
        self.logits_fp32 = on and self.lm_head.weight.dtype != torch.float32
        self.lm_head_fp32 = fp32_readout_copy(self.lm_head.weight) if self.logits_fp32 else None
        return self

    def readout(self, normed: torch.Tensor) -> torch.Tensor:
        """normed [..., H] (after the final norm) -> logits [..., V]: in the model's dtype, or fp32 (fp32_readout)."""
        if self.logits_fp32:
            return fp32_logits(normed, self.lm_head.weight, self.lm_head_fp32)
        return self.lm_head(normed)  # several rows on a CPU: from a packed copy (cpu_gemm.py)

    def _fp32_again(self) -> None:
        if self.fp32_wanted:
            self.fp32_readout(True)

    def _apply(self, fn, recurse=True):
        self.lm_head_fp32 = None  # not moved: made again from the moved weight
        super()._apply(fn, recurse)
        self._fp32_again()
        return self


def _fp32_after_load(module: Fp32Readout, _incompatible_keys) -> None:
    module._fp32_again()


def fp32_readout_copy(w: torch.Tensor) -> torch.Tensor | None:
    """What fp32_logits needs besides w [V, H]: nothing on CUDA, whose torch.mm(out_dtype=fp32) multiplies the
    bf16 / fp16 weight in place (CUDA builds since torch 2.8); elsewhere an fp32 copy of it (V x H x 4 bytes:
    CPU BLAS has no such GEMM, and casting per step costs ~10x the product), stored [H, V] on CPU."""
    if w.is_cuda and _mm_out_fp32_works(w):
        return None
    from toolkit.infer.prepare import in_out_storage

    return in_out_storage(w.detach().float())


def fp32_logits(x: torch.Tensor, w: torch.Tensor, w32: torch.Tensor | None) -> torch.Tensor:
    """x [..., H] in the model's dtype, w [V, H] -> fp32 logits [..., V]: x and w as held, products summed in
    fp32 (through w32, fp32_readout_copy's copy, when there is one)."""
    if w32 is not None:
        return torch.nn.functional.linear(x.float(), w32)
    if not w.is_cuda:  # no copy made for this device (fp32_readout does make one): cast per call
        return torch.nn.functional.linear(x.float(), w.float())
    return torch.mm(x.reshape(-1, w.shape[1]), w.t(), out_dtype=torch.float32).view(*x.shape[:-1], w.shape[0])


def _mm_out_fp32_works(w: torch.Tensor) -> bool:
    try:
        torch.mm(w[:1], w[:2].t(), out_dtype=torch.float32)
        return True
    except (RuntimeError, TypeError, NotImplementedError):
        return False
