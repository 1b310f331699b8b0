"""Run logging: one JSON line per logged step in output_dir/metrics.jsonl (always, main process), and accelerate's
trackers: `report_to` (wandb, tensorboard, mlflow, ...), or wandb when `wandb_project` is set (WANDB_MODE=offline
works with no network)."""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import torch


class Tracker:
    def __init__(self, accelerator, output_dir: Path, cfg):
        self.acc, self.path = accelerator, output_dir / "metrics.jsonl"
        from toolkit.train.launch import trackers

        self.trackers = bool(trackers(cfg))  # any tracker of accelerate's (wandb the first kind)
        if self.trackers:
            config = {k: (v if isinstance(v, (int, float, str, bool)) or v is None else json.dumps(v))
                      for k, v in dataclasses.asdict(cfg).items()}  # tensorboard's hparams take scalars only
            try:
                accelerator.init_trackers(cfg.wandb_project or Path(cfg.output_dir).name, config=config,
                                          init_kwargs={"wandb": {"name": cfg.wandb_run, "dir": str(output_dir)}})
            except Exception as e:  # wandb's UsageError (no API key), a tracker's missing package, ...
                raise ValueError(f"report_to {trackers(cfg)}: a tracker could not start ({type(e).__name__}: "
                                 f"{str(e).splitlines()[0][:200]}); for wandb: `wandb login`, WANDB_API_KEY, or "
                                 "WANDB_MODE=offline (synced later with `wandb sync`)") from None
            started = {t.name for t in accelerator.trackers}
            if accelerator.is_main_process and (missing := [t for t in trackers(cfg) if t not in started]):
                raise ValueError(f"report_to {missing}: not started (accelerate leaves out a tracker whose package "
                                 f"is not installed: pip install {' '.join(missing)})")

    def log(self, step: int, values: dict) -> None:
        if not self.acc.is_main_process:
            return
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"step": step, **values}) + "\n")
        if self.trackers:
            flat = {}
            for k, v in values.items():
                if isinstance(v, list):
                    flat.update({f"{k}/{i}": x for i, x in enumerate(v)})
                elif v is not None:
                    flat[k] = v
            self.acc.log(flat, step=step)

    def finish(self) -> None:
        if self.trackers:
            self.acc.end_training()


class Window:
    """What the micro-batches since the last log add up to on this rank, reduced over the ranks into one record."""

    def __init__(self):
        self.loss, self.losses, self.acc, self.count, self.tokens, self.n = 0.0, 0.0, 0.0, 0.0, 0, 0
        self.t0 = time.perf_counter()

    def add(self, loss: torch.Tensor, losses: torch.Tensor, accs: torch.Tensor, counts: torch.Tensor,
            tokens: int) -> None:
        """A micro-batch: its loss, per-TTT-step mean losses and accuracies [ttt] over counts [2, ttt] tokens
        (the loss's rows, the accuracy's)."""
        self.loss += float(loss.detach())
        self.losses = self.losses + losses.detach() * counts[0]
        self.acc = self.acc + accs * counts[1]
        self.count = self.count + counts
        self.tokens += tokens
        self.n += 1

    def record(self, acc, epoch: int, **extra) -> dict:
        """The logged record (a collective: every rank calls it at the same step). Per-step loss and accuracy are
        token means over every rank's micro-batches; extra (lr, grad_norm, ...) is added as given."""
        from toolkit.train.losses import simulated_tau

        device = acc.device
        sums = acc.reduce(torch.stack([self.losses, self.acc, *self.count.float()]), "sum")
        tokens = int(acc.reduce(torch.tensor(self.tokens, device=device), "sum"))
        # with the step-wide denominators the micro-batch losses' mean is each step's token mean
        loss_sum, n = acc.reduce(torch.tensor([self.loss, float(self.n)], device=device), "sum").tolist()
        # the epoch of the step's last micro-batch, which the last rank holds (one process accumulating logs that)
        epoch = int(acc.reduce(torch.tensor(epoch, device=device), "max"))
        acc_i = (sums[1] / sums[3].clamp_min(1)).cpu()
        return {"epoch": epoch, "loss": loss_sum / n, "loss_i": (sums[0] / sums[2].clamp_min(1)).tolist(),
                "acc_i": acc_i.tolist(),
                "simulated_tau": simulated_tau(acc_i), "tokens_per_second": tokens / (time.perf_counter() - self.t0),
                **extra}


def read_metrics(path: Path) -> list[dict]:
    """The logged records, the last one per (step, kind) kept (a resumed run logs its steps again)."""
    seen = {}
    for line in Path(path).read_text().splitlines():
        rec = json.loads(line)
        seen[(rec["step"], "eval_engine_tau" in rec)] = rec
    return [seen[k] for k in sorted(seen)]
