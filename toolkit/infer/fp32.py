"""A module's tensors that stay float32 whatever dtype the module is moved to.

nn.Module.to(dtype) / .bfloat16() / .half() cast every floating tensor. Two must not be: RoPE's inverse
frequencies (bf16 keeps 8 bits of each, so the angle at position 4,000 is off by up to ~0.4 rad, and a draft's
rotations stop matching the target's) and DeepSeek-V3's router (`gate.weight`, `e_score_correction_bias`:
transformers keeps both in fp32 with `_keep_in_fp32_modules_strict`, SGLang too; rounded to bf16 the bias
re-routes tokens to other experts). A subclass names them in `keep_fp32`; a move then follows only the device.
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
