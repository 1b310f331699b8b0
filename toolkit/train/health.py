"""A run that stops learning because its numbers left the float range stops, saying so, instead of exporting an
untrained head after hours of steps.

Under fp16 (GPUs before sm_80) the loss scaler skips a step whose gradients hold inf / nan and halves its scale:
a few skips while it finds its scale are normal, but a target or head whose activations overflow fp16 gets every
step skipped, forever, with the loss logged as nan and the weights never moving. Without a scaler (fp32, bf16) a
non-finite loss puts nan into the weights at the next optimizer step and every later loss is nan too. Both checks
use numbers every rank holds alike (the step's skip follows the all-reduced gradients, the logged loss is reduced
over the ranks), so every rank raises at the same step.
"""
from __future__ import annotations

import math

MAX_SKIPPED = 50  # GradScaler starts at 2^16 and halves per skip: finding its scale takes ~10-20 skips at most


class Health:
    def __init__(self, scaler: bool):
        self.scaler = scaler  # fp16: accelerate's (or DeepSpeed's) loss scaler skips steps
        self.skipped, self.in_a_row = 0, 0

    def after_step(self, optimizer) -> None:
        """After an optimizer step that synced gradients."""
        skipped = bool(getattr(optimizer, "step_was_skipped", False))
        self.skipped += skipped
        self.in_a_row = self.in_a_row + 1 if skipped else 0
        if self.in_a_row >= MAX_SKIPPED:
            raise RuntimeError(
                f"{self.in_a_row} optimizer steps in a row were skipped: the fp16 loss scaler found inf / nan "
                "gradients at every one, so the head is not learning. The target's features or the head's forward "
                "overflow float16 (a model trained in bf16 can: Gemma is known to); train with mixed_precision=no "
                "and dtype=float32, or on a GPU with bf16 (sm_80+)")

    def check(self, record: dict, step: int) -> None:
        """A logged record (its loss reduced over the ranks); adds the skip count under fp16."""
        if self.scaler:
            record["skipped_steps"] = self.skipped
        elif not math.isfinite(record["loss"]):
            raise RuntimeError(
                f"the loss is {record['loss']} in the steps logged at step {step}: the weights are nan from here on. "
                "The target's features or the head's forward left the float range (bf16 or fp16 autocast: train "
                "with mixed_precision=no), or the lr is too high for this data; resume from an earlier checkpoint "
                "(--resume takes the newest: delete the later ones) or --overwrite")
