"""Run logging: one JSON line per logged step in output_dir/metrics.jsonl (always, main process), and wandb
through accelerate's tracker when `wandb_project` is set (WANDB_MODE=offline works with no network)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path


class Tracker:
    def __init__(self, accelerator, output_dir: Path, cfg):
        self.acc, self.path = accelerator, output_dir / "metrics.jsonl"
        self.wandb = bool(cfg.wandb_project)
        if self.wandb:
            accelerator.init_trackers(cfg.wandb_project, config=dataclasses.asdict(cfg),
                                      init_kwargs={"wandb": {"name": cfg.wandb_run, "dir": str(output_dir)}})

    def log(self, step: int, values: dict) -> None:
        if not self.acc.is_main_process:
            return
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"step": step, **values}) + "\n")
        if self.wandb:
            flat = {}
            for k, v in values.items():
                if isinstance(v, list):
                    flat.update({f"{k}/{i}": x for i, x in enumerate(v)})
                elif v is not None:
                    flat[k] = v
            self.acc.log(flat, step=step)

    def finish(self) -> None:
        if self.wandb:
            self.acc.end_training()


def read_metrics(path: Path) -> list[dict]:
    """The logged records, the last one per (step, kind) kept (a resumed run logs its steps again)."""
    seen = {}
    for line in Path(path).read_text().splitlines():
        rec = json.loads(line)
        seen[(rec["step"], "eval_engine_tau" in rec)] = rec
    return [seen[k] for k in sorted(seen)]
