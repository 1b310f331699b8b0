"""`toolkit quickstart`: the whole pipeline on the embedded SmolLM2 target, in a time budget, with no network:
the project's own prompts -> the target's own answers -> token map -> prepared data -> EAGLE-3 training with
training-time test -> bench against plain decoding and transformers `generate` -> DIR/report.md.

    toolkit quickstart --out quickstart --minutes 20

Every stage runs the same `toolkit` command a user would, prints it, and is skipped when its output exists,
so a rerun after a kill resumes (regeneration and training resume mid-way too). On a GPU the same stages use
the GPU with larger sizes.
"""
from __future__ import annotations

import argparse
import itertools
import json
import shlex
import shutil
import time
from dataclasses import asdict
from pathlib import Path

from toolkit.atomic import check_out_path, write_text
from toolkit.cpu_speed import BF16_MIN_GAIN
from toolkit.embedded import DEFAULT_MODEL, MARKER, model_dir
from toolkit.quickstart_plan import REFERENCE_GFLOPS, Plan, pick_precision, pick_speed


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="quickstart", help="output folder (an existing one is resumed)")
    p.add_argument("--minutes", type=float, default=20.0, help="time budget for the whole run (install excluded)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="auto: cuda if available")
    p.add_argument("--speed", default="auto", type=_speed_arg,
                   help="this CPU's speed relative to the box the plan's rates were measured on (1.0); auto times "
                        "an fp32 GEMM first, so --minutes holds on slower and faster machines alike")
    p.add_argument("--mixed-precision", default="auto", choices=["auto", "no", "bf16"],
                   help="the head's training precision; on a CPU auto times a bf16 GEMM against fp32 and trains in "
                        f"bf16 (the target too) when bf16 is >= {BF16_MIN_GAIN:g}x faster (native bf16, e.g. "
                        "AVX512-BF16 or AMX); on a GPU auto is the trainer's rule (head and target in bf16 from "
                        "sm_80, fp16 before)")


def _speed_arg(text: str) -> str | float:
    if text == "auto":
        return text
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0.01 <= value <= 100:
        raise argparse.ArgumentTypeError(f"{text!r}: give auto or a relative speed in 0.01..100 (1.0 = the 2-core "
                                         f"box of {REFERENCE_GFLOPS:g} GFLOP/s the plan was measured on)")
    return value


# The bench's fourth run: a 3-step chain with a 10-token prompt-lookup branch (toolkit/infer/lookup.py)
LOOKUP_SWEEP = "3,1,4,10"


def _run(argv: list[str], ok: tuple[int, ...] = (0,)) -> None:
    from toolkit.cli import Terminated, main

    print(f"\n$ toolkit {shlex.join(argv)}", flush=True)  # quoted: it pastes as it ran, spaces in paths too
    rc = main(argv)
    if rc in (130, 143):  # the stage was interrupted (Ctrl-C, SIGTERM) and cleaned up after itself: so is this run
        raise Terminated() if rc == 143 else KeyboardInterrupt()
    if rc not in ok:
        raise RuntimeError(f"`toolkit {argv[0]}` failed (exit {rc}); fix the cause and rerun: finished stages "
                           "are kept")


def _jsonl(path: Path, rows: list[dict]) -> None:
    write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def whole_lines(path: Path) -> int:
    """Lines of a JSONL file that were written whole: a kill mid-write leaves a torn last line (no newline), which
    regenerate's resume repairs, so it does not count as an answer."""
    if not path.is_file():
        return 0
    with path.open("rb") as f:
        return sum(line.endswith(b"\n") for line in f)


def refuse_another_plan(out: Path, state: dict, plan: Plan, minutes: float) -> None:
    """A rerun resumes the run in --out only under the plan it was sized by: its finished stages (how many prompts
    were answered, the draft vocabulary, ...) fit that plan, and the report would otherwise state the new one."""
    before = state.get("plan")
    if before is None or not (out / "prompts.jsonl").is_file():
        return
    now = asdict(plan)
    changed = [k for k in now if k in before and before[k] != now[k]]
    if state.get("minutes") != minutes or changed:
        raise ValueError(f"--out {out} holds a run planned for {state.get('minutes'):g} minutes (speed "
                         f"{before.get('speed')}); this one plans {minutes:g} minutes (speed {plan.speed})"
                         + (f", other {', '.join(changed)}" if changed else "") + ": rerun with the first run's "
                         "--minutes and --speed to resume it, or give another --out")


def main(args: argparse.Namespace) -> int:
    from toolkit.data.topics import topic_prompts
    from toolkit.infer.loading import pick_device
    from toolkit.models import resolve_target

    if not 2 <= args.minutes < float("inf"):  # NaN fails too: it planned NaN-sized stages and ran them
        raise ValueError(f"--minutes {args.minutes}: give a finite time budget; the pipeline needs at least 2 minutes")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; give a folder (made if absent, resumed if it holds a run)")
    check_out_path("--out", out, folder=True)
    device, _ = pick_device(args.device)
    gpu = device == "cuda"
    out.mkdir(parents=True, exist_ok=True)
    state_file = out / "quickstart.json"
    state = json.loads(state_file.read_text()) if state_file.is_file() else {"stages": {}}
    speed = pick_speed(args.speed, args.minutes, state, gpu)
    plan = Plan.for_budget(args.minutes, gpu, speed, *pick_precision(args.mixed_precision, args.minutes, state, gpu))
    refuse_another_plan(out, state, plan, args.minutes)
    state.update(plan=asdict(plan), minutes=args.minutes, device=device)
    dev = ["--device", device]
    t_all = time.perf_counter()
    numbers = itertools.count(1)  # a stage's place in the pipeline, the same on a rerun that skips some

    def stage(name: str, output: Path, run, done: bool | None = None) -> None:
        """Run a stage unless its output exists (done overrides the check)."""
        n = next(numbers)
        if output.exists() if done is None else done:
            print(f"[quickstart] {name}: done already ({output}), skipped", flush=True)
            state["stages"].setdefault(name, {"seconds": 0.0, "skipped": True})  # keep a timing run earlier
            return
        print(f"[quickstart] stage {n}: {name}", flush=True)
        t0 = time.perf_counter()
        run()
        state["stages"][name] = {"seconds": round(time.perf_counter() - t0, 1), "skipped": False}
        write_text(state_file, json.dumps(state, indent=2) + "\n")

    stage("target", model_dir(DEFAULT_MODEL) / MARKER, lambda: resolve_target(DEFAULT_MODEL))  # converted once
    stage("prompts", out / "eval_prompts.jsonl", lambda: (
        _jsonl(out / "prompts.jsonl", topic_prompts(plan.prompts)),
        _jsonl(out / "eval_prompts.jsonl", topic_prompts(plan.eval_prompts, start=plan.prompts))))
    regen = out / "regen.jsonl"
    answered = whole_lines(regen) >= plan.prompts
    stage("regenerate", regen, done=answered, run=lambda: _run(
        ["regenerate", "--data", str(out / "prompts.jsonl"), "--out", str(regen), "--max-new-tokens",
         str(plan.max_new_tokens), "--batch-size", "32", "--max-len", "1024", "--threads", str(plan.threads), *dev,
         "--dtype", plan.answer_dtype], ok=(0, 1)))  # 1: a few conversations got no answer; the rest go on
    vocab_map = out / "maps" / f"vocab_map_{plan.draft_vocab}.safetensors"
    # coverage.json is build-token-map's last file: a kill before it left maps without it, then taken as done
    stage("token map", out / "maps" / "coverage.json", done=vocab_map.is_file() and (out / "maps" / "coverage.json")
          .is_file(), run=lambda: _run(
        ["build-token-map", "--data", str(regen), "--sizes", str(plan.draft_vocab), "--out", str(out / "maps"),
         "--assistant-only"]))
    stage("prepare data", out / "prepared" / "toolkit_prepare.json", lambda: _run(
        ["prepare-data", "--data", str(regen), "--out", str(out / "prepared"), "--max-len", "1024"]))
    prep = json.loads((out / "prepared" / "toolkit_prepare.json").read_text())
    steps = plan.train_steps(prep["tokens"] / max(prep["kept"], 1))
    train_dir = out / "train"

    def train() -> None:
        if not (train_dir / "draft" / "model.safetensors").is_file():
            _run(["train", "--data", str(out / "prepared"), "--output-dir", str(train_dir), "--token-map",
                  str(vocab_map), f"max_steps={steps}", "batch_size=4", "max_len=1024", "lr=1e-3",
                  "warmup_ratio=0.05", "eval_every=0", f"eval_samples={min(8, max(2, plan.prompts // 20))}",
                  "eval_max_new_tokens=64", "log_every=5", f"save_every={max(steps // 4, 10)}",
                  # the step estimate can be off: the clock decides, leaving the stage's last minute on a CPU to
                  # the final held-out evaluation and the export (64 s on a 2-core AVX2 box, 2026-11-25)
                  f"max_minutes={max(plan.train_seconds - (0 if gpu else 60), 30) / 60:.2f}",
                  f"threads={plan.threads}", f"mixed_precision={plan.precision}"]
                 + (["--resume"] if any(train_dir.glob("checkpoint-*")) else []))
        tmp = out / "draft.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(train_dir / "draft", tmp)
        tmp.rename(out / "draft")  # DIR/draft: the head to serve

    stage("train", out / "draft" / "model.safetensors", train)
    stage("bench", out / "bench.json", done=(out / "bench.json").is_file() and (out / "bench.png").is_file(),
          run=lambda: _run(
        ["bench", "--draft", str(out / "draft"), "--prompts", str(out / "eval_prompts.jsonl"),
         "--max-new-tokens", str(plan.max_new_tokens), "--num-steps", "5", "--baseline", "--compare-hf",
         # the head again with a prompt-lookup branch grafted on (the CPU configuration of RESULTS.md)
         "--sweep", LOOKUP_SWEEP, "--threads", "1" if not gpu else "0", "--out", str(out / "bench.json"), *dev]))

    from toolkit.quickstart_report import lookup_run, write_report

    report = write_report(out, state, steps)
    state["total_seconds"] = round(time.perf_counter() - t_all, 1)
    write_text(state_file, json.dumps(state, indent=2) + "\n")
    bench = json.loads((out / "bench.json").read_text())
    print(f"\n[quickstart] tau {bench['speculative']['tau']:.2f}, speed-up x{bench['speedup_vs_baseline']:.2f} vs "
          f"plain decoding, x{bench['speedup_vs_hf']:.2f} vs transformers generate")
    grafted = lookup_run(bench)
    if grafted is not None:
        print(f"[quickstart] with a {grafted['lookup']}-token prompt-lookup branch: tau {grafted['tau']:.2f}, x"
              f"{grafted['tokens_per_second'] / bench['hf_generate']['tokens_per_second']:.2f} vs transformers")
    print(f"[quickstart] report: {report}")
    print(f"[quickstart] serve it:  toolkit serve --draft {out / 'draft'}")
    return 0
