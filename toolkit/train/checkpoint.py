"""Checkpoints: `checkpoint-{step}/` = accelerate's resumable state (model, optimizer, scheduler, RNG and our
progress counters) plus an exported draft folder `draft/` (docs/formats.md section 7) that `toolkit bench` and
`toolkit serve --draft` load directly. Written into a temp folder and renamed, so a folder named
checkpoint-N is always complete; the newest such folder is where a resumed run starts."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import torch

from toolkit.atomic import write_text


class Progress:
    """Counters saved with the accelerate state (register_for_checkpointing needs state_dict/load_state_dict)."""

    def __init__(self, rows_per_step: int = 0):
        self.step, self.tokens = 0, 0
        self.rows_per_step = self.saved_rows_per_step = rows_per_step  # batch_size x grad_accum x processes

    def state_dict(self) -> dict:
        return {"step": self.step, "tokens": self.tokens, "rows_per_step": self.rows_per_step}

    def load_state_dict(self, state: dict) -> None:
        self.step, self.tokens = int(state["step"]), int(state["tokens"])
        self.saved_rows_per_step = int(state.get("rows_per_step", self.rows_per_step))  # older checkpoints: unsaid


def latest(output_dir: Path) -> Path | None:
    done = [(int(m.group(1)), p) for p in output_dir.glob("checkpoint-*")
            if (m := re.fullmatch(r"checkpoint-(\d+)", p.name)) and p.is_dir()]
    return max(done)[1] if done else None


def export_draft(accelerator, model, template_head, folder: Path, save, target_cfg: dict, target: str,
                 fingerprint: str, extra: dict) -> None:
    """Gather the full head weights (a collective under ZeRO-3: every rank calls this) and write the draft
    folder from the main process with `save` (the head kind's writer)."""
    state = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        head = template_head
        head.load_state_dict({k.removeprefix("head."): v.float() for k, v in state.items() if k.startswith("head.")})
        save(head, folder, target_cfg, target, fingerprint, extra)


def save(accelerator, model, template_head, output_dir: Path, step: int, keep: int, export_args: tuple) -> Path:
    final = output_dir / f"checkpoint-{step}"
    tmp = output_dir / f".checkpoint-{step}.tmp"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    export_draft(accelerator, model, template_head, tmp / "draft", *export_args)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        replace_dir(tmp, final)
        write_text(output_dir / "latest", final.name + "\n")
        old = sorted((int(p.name.split("-")[1]), p) for p in output_dir.glob("checkpoint-*") if p.is_dir())
        for _, p in old[:-keep]:
            shutil.rmtree(p, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def replace_dir(new: Path, final: Path) -> None:
    """Put the complete folder `new` at `final`: the folder there is moved aside and removed only after the
    rename, so a run killed at any point leaves a whole folder at `final` or (between the two renames) beside it
    as .NAME.old, never a half-deleted one."""
    old = final.with_name(f".{final.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    new.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def publish_draft(checkpoint: Path, output_dir: Path) -> None:
    """Copy the final checkpoint's draft to output_dir/draft (a complete copy, then renamed into place)."""
    tmp = output_dir / ".draft.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(checkpoint / "draft", tmp)
    replace_dir(tmp, output_dir / "draft")


def peak_memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
