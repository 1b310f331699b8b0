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
from toolkit.train.objectives import frozen_names


class Progress:
    """Counters saved with the accelerate state (register_for_checkpointing needs state_dict/load_state_dict), and
    the launch that wrote them, which check_launch compares before accelerate reads the rest."""

    def __init__(self, rows_per_step: int = 0, launch: dict | None = None):
        self.step, self.tokens = 0, 0
        self.rows_per_step = rows_per_step  # batch_size x grad_accum x processes
        self.launch = launch or {}  # launch_of: processes, ZeRO stage (None: no DeepSpeed), DeepSpeed's precision

    def state_dict(self) -> dict:
        return {"step": self.step, "tokens": self.tokens, "rows_per_step": self.rows_per_step, "launch": self.launch}

    def load_state_dict(self, state: dict) -> None:
        self.step, self.tokens = int(state["step"]), int(state["tokens"])


def launch_of(accelerator) -> dict:
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None:  # a plain optimizer state: any autocast resumes alike (fp16's loss scale: see load)
        return {"processes": accelerator.num_processes, "zero_stage": None}
    # DeepSpeed saves a bf16 run's optimizer as bf16_zero_pp_rank_*: the other precision looks for other files
    precision = {"no": "fp32"}.get(accelerator.mixed_precision, accelerator.mixed_precision)
    return {"processes": accelerator.num_processes, "zero_stage": int(plugin.zero_stage), "precision": precision}


def check_launch(checkpoint: Path, rows_per_step: int, launch: dict) -> None:
    """Refuse, before accelerate loads it, a checkpoint this launch cannot continue exactly. Another number of
    processes changes what a step is: the data skip would be off, and the schedule, which accelerate steps once
    per process, would resume at another point of its curve (0 for 2 -> 1 processes). Another ZeRO stage, or
    DeepSpeed against none, or another precision under DeepSpeed, finds the optimizer saved in another layout
    (and a ZeRO checkpoint partitioned for as many ranks as wrote it): accelerate and DeepSpeed failed there on an
    assertion, a missing file or a tensor size."""
    path = checkpoint / "custom_checkpoint_0.pkl"
    if not path.is_file():
        return
    saved = torch.load(path, weights_only=True)
    rows, was = saved.get("rows_per_step"), saved.get("launch") or {}  # older checkpoints: unsaid
    say = lambda x: f"{x['processes']} process(es) " + (  # noqa: E731
        "without DeepSpeed" if x["zero_stage"] is None else f"under DeepSpeed ZeRO-{x['zero_stage']} in {x['precision']}")
    if was and was != launch:
        raise ValueError(f"cannot resume from {checkpoint}: it was written by {say(was)}, this launch runs "
                         f"{say(launch)}; launch it as it was trained (or --overwrite to start afresh)")
    if rows is not None and rows != rows_per_step:
        raise ValueError(f"cannot resume {checkpoint.parent}: its steps took {rows} rows each (batch_size x "
                         f"grad_accum x processes), this launch's take {rows_per_step} on {launch['processes']} "
                         "process(es); launch it with the number of processes it was trained with")


def load(accelerator, checkpoint: Path) -> None:
    """accelerate's load_state. A run resumed under fp16 from a checkpoint written in bf16 or fp32 (a T4's runs before
    fp16 was its default) has no loss scale saved, where accelerate would fail on the missing file: its scale starts
    afresh (the scaler finds it again in a few skipped steps)."""
    from accelerate.utils import SCALER_NAME
    from safetensors import SafetensorError

    scaler = accelerator.scaler
    if scaler is not None and not (checkpoint / SCALER_NAME).is_file():
        accelerator.print(f"{checkpoint} was written without fp16 loss scaling: the loss scale starts afresh")
        accelerator.scaler = None
    try:
        accelerator.load_state(str(checkpoint))
    except (SafetensorError, RuntimeError, OSError, EOFError) as err:  # a file cut short, missing or not one
        raise ValueError(f"cannot resume from {checkpoint}: it is damaged ({str(err).splitlines()[0][:160]}); delete "
                         "that folder to resume from the checkpoint before it, or --overwrite to start afresh") from None
    finally:
        accelerator.scaler = scaler


def open_output_dir(out: Path, resume: bool, overwrite: bool) -> None:
    """A folder holding a previous run (its run.json) is continued with --resume, replaced with --overwrite (by
    replace_output_dir, once every input has been checked), and otherwise refused, as is --resume on a folder
    without one."""
    previous = (out / "run.json").exists()
    if previous and not (resume or overwrite):
        raise ValueError(f"output_dir {out} holds a previous run; pass --resume to continue it or --overwrite "
                         "to replace it")
    if resume and not previous:
        raise ValueError(f"--resume: output_dir {out} holds no run to resume")


def replace_output_dir(accelerator, out: Path, overwrite: bool) -> None:
    """--overwrite: the previous run goes just before the new one writes its first file, so a run refused for
    its data, token map or target (checked after open_output_dir) leaves the old one whole."""
    if overwrite and (out / "run.json").exists() and accelerator.is_main_process:
        shutil.rmtree(out)
    accelerator.wait_for_everyone()


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
        load_head(template_head, state)
        save(template_head, folder, target_cfg, target, fingerprint, extra)


def load_head(template_head, state: dict) -> None:
    """The gathered weights' `head.` entries into the CPU template. The target's frozen copies (eagle's and mtp's
    lm_head), which the trained model's state leaves out (objectives.DraftTrainable), are the template's own."""
    got = template_head.load_state_dict({k.removeprefix("head."): v.float() for k, v in state.items()
                                         if k.startswith("head.")}, strict=False)
    frozen = frozen_names(template_head)
    if got.unexpected_keys or set(got.missing_keys) - frozen:
        raise RuntimeError(f"the trained head's weights do not fit its template: missing "
                           f"{sorted(set(got.missing_keys) - frozen)}, unexpected {got.unexpected_keys}")


def save(accelerator, model, template_head, output_dir: Path, step: int, keep: int, export_args: tuple) -> Path:
    final = output_dir / f"checkpoint-{step}"
    tmp = output_dir / f".checkpoint-{step}.tmp"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    # DeepSpeed writes the frozen parameters' fragments beside the module's state unless told not to (the
    # module's own state leaves them out: objectives.DraftTrainable)
    frozen_out = {"exclude_frozen_parameters": True} if accelerator.state.deepspeed_plugin is not None else {}
    try:
        accelerator.save_state(str(tmp), **frozen_out)
        export_draft(accelerator, model, template_head, tmp / "draft", *export_args)
    except BaseException:  # Ctrl-C / SIGTERM / a full disk mid-save: no half-written checkpoint stays behind
        if accelerator.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
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
    try:
        shutil.copytree(checkpoint / "draft", tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    replace_dir(tmp, output_dir / "draft")


def peak_memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
