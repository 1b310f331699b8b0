"""How a training run is launched: its command line (a recipe plus key=value overrides, `toolkit train` and the
entry scripts eagle3.py / eagle.py / mtp.py alike) and the accelerate Accelerator it runs under (one process,
CPU ranks over gloo, GPUs, DeepSpeed ZeRO-2/3 from `accelerate launch --config_file recipes/accelerate/<x>.yaml`).
The run itself is trainer.py's."""
from __future__ import annotations

import argparse
import os
import sys
from datetime import timedelta

import torch


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, help="recipe YAML (recipes/*.yaml)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="override any recipe key")
    for flag, key in (("--model", "model"), ("--data", "data"), ("--output-dir", "output_dir"),
                      ("--max-steps", "max_steps"), ("--token-map", "token_map"),
                      ("--hidden-states", "hidden_states")):
        p.add_argument(flag, dest=key, default=None, help=f"same as {key}=...")
    p.add_argument("--resume", action="store_true", help="continue the run in output_dir from its last checkpoint")
    p.add_argument("--overwrite", action="store_true", help="delete a previous run in output_dir first")
    import dataclasses

    from toolkit.train.config import TrainConfig

    keys = ", ".join(f"{f.name}={f.default}" for f in dataclasses.fields(TrainConfig)
                     if f.init and f.default is not dataclasses.MISSING)
    p.epilog = f"recipe keys and their defaults (toolkit/train/config.py says what each does): {keys}"


def parse_with_overrides(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """parse_args, except that key=value overrides may also follow the options (`--output-dir run lr=1e-3`):
    argparse hands a positional list only the words before the first option, and refuses the rest."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        if hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
            args.overrides = [*(args.overrides or []), *extra]
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def trackers(cfg) -> list[str]:
    """The trackers a run reports to besides metrics.jsonl: report_to, or wandb when wandb_project is set."""
    chosen = getattr(cfg, "report_to", None)
    return list(chosen) if chosen is not None else ["wandb"] if cfg.wandb_project else []


def make_accelerator(cfg):
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs, ProjectConfiguration

    # CPU ranks talk over gloo (without this handler accelerate + DeepSpeed on CPU see 1 process per rank)
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    group = {"backend": "gloo"} if distributed and not torch.cuda.is_available() else {}
    if cfg.dist_timeout is not None:  # rank 0 counts the vocabulary of a big corpus while the others wait
        group["timeout"] = timedelta(minutes=cfg.dist_timeout)
    handlers = [InitProcessGroupKwargs(**group)] if group else []
    log_with = trackers(cfg) or None
    # mixed_precision "auto" keeps a half precision the launch named; else on a CPU it follows this CPU's GEMM
    # rates (emulated bf16, without AVX512-BF16 / AMX, trained ~60x slower) and on a GPU it is bf16 where the card
    # has a bf16 matrix unit, fp16 before it (precision.py: the target runs in that half precision already;
    # accelerate's default would leave the head fp32)
    requested, launched = cfg.mixed_precision, os.environ.get("ACCELERATE_MIXED_PRECISION")
    if not torch.cuda.is_available() or os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes"):
        from toolkit.cpu_speed import cpu_training_precision

        requested, note = cpu_training_precision(requested, launched, cfg.threads or torch.get_num_threads())
        if note and os.environ.get("RANK", "0") == "0":
            print(note, file=sys.stderr if note.startswith("WARNING") else sys.stdout, flush=True)
    else:
        from toolkit.gpu_half import has_bf16
        from toolkit.train.precision import gpu_training_precision

        requested = gpu_training_precision(requested, launched, has_bf16())
    precision = {} if requested == "auto" else {"mixed_precision": requested}
    # ranks on a machine without CUDA: accelerate makes them DDP over gloo only when told it runs on the CPU
    # (ACCELERATE_USE_CPU=1); launched otherwise (multi_gpu.yaml, or cpu_2ranks.yaml without the variable) it set up no
    # DDP at all and each rank trained its own copy on half the tokens. DeepSpeed's CPU ranks set themselves up.
    deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() in ("1", "true", "yes")
    on_cpu = {"cpu": True} if distributed and not torch.cuda.is_available() and not deepspeed else {}
    acc = Accelerator(gradient_accumulation_steps=cfg.grad_accum, log_with=log_with, kwargs_handlers=handlers,
                      project_config=ProjectConfiguration(cfg.output_dir, logging_dir=f"{cfg.output_dir}/runs"),
                      **precision, **on_cpu)  # tensorboard writes under output_dir/runs/<project>
    if distributed and acc.num_processes == 1 or distributed and acc.distributed_type.value == "NO":
        raise ValueError(f"{os.environ['WORLD_SIZE']} ranks were launched, but accelerate set up no distributed "
                         "training (each rank would train its own copy); on CPU ranks launch with "
                         "ACCELERATE_USE_CPU=1 (recipes/accelerate/cpu_2ranks.yaml's header)")
    if acc.state.deepspeed_plugin is not None:  # fill the DeepSpeed config's "auto" values from the recipe
        ds = acc.state.deepspeed_plugin.deepspeed_config
        ds["train_micro_batch_size_per_gpu"] = cfg.batch_size
        ds["gradient_accumulation_steps"] = cfg.grad_accum
        if ds.get("gradient_clipping", "auto") == "auto":
            ds["gradient_clipping"] = cfg.max_grad_norm
        ds.setdefault("bf16", {})["enabled"] = acc.mixed_precision == "bf16"
    return acc


def cli(script: str, doc: str, head_kind: str, argv: list[str] | None = None) -> int:
    """An entry script's command line (`accelerate launch toolkit/train/<head>.py ...`)."""
    p = argparse.ArgumentParser(prog=script, description=doc.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_args(p)
    args = parse_with_overrides(p, argv)
    from toolkit.cli import reported
    from toolkit.train.trainer import main

    return reported(script, lambda: main(args, head_kind))  # as `toolkit train` ends: errors, Ctrl-C, SIGTERM
