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
import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from toolkit.atomic import check_out_path, write_text
from toolkit.cpu_speed import BF16_MIN_GAIN, bf16_pays, measure_gflops
from toolkit.embedded import DEFAULT_MODEL, MARKER, model_dir


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


# The plan's rates (answers, training tokens and bench prompts per second) were measured on a 2-core box whose
# fp32 GEMM below ran at about this rate on 2 threads. A slower VM measured 28-67 GFLOP/s within one hour while it
# trained at a steady ~70 tokens/s (200 on the reference box): the GEMM rate sizes the plan only to within ~2x,
# so the training stage is also bounded by the clock (max_minutes).
REFERENCE_GFLOPS = 128.0
# Training under bf16 autocast on a CPU with native bf16 (AVX512-BF16) ran 1.52-1.54x the tokens/s of fp32 at
# the same losses, where the bf16 GEMM ran 2.2x fp32 (RESULTS.md, 2026-11-25); bf16 is taken only where its
# GEMM is clearly faster (cpu_speed.BF16_MIN_GAIN).
BF16_TRAIN_GAIN = 1.5
# And the target answering the training prompts in bf16 there (`toolkit regenerate --dtype bfloat16`, batch 16):
# 1.52x the tokens/s of fp32 (RESULTS.md, 2026-11-28).
BF16_ANSWER_GAIN = 1.5
# The bench's fourth run: a 3-step chain with a 10-token prompt-lookup branch (toolkit/infer/lookup.py)
LOOKUP_SWEEP = "3,1,4,10"


@dataclass(frozen=True)
class Plan:
    """Sizes that fit the budget, from rates measured on a 2-core CPU, times the machine's relative speed
    (measured on a CPU; a fixed 25 on a GPU, where these small steps are bound by launches, not FLOPs; the
    bench's prompts on a GPU from their own rate, see for_budget)."""
    prompts: int          # training conversations the target answers
    max_new_tokens: int   # per answer
    eval_prompts: int     # held-out prompts for the bench
    train_seconds: float  # training budget; steps follow from the prepared token count
    draft_vocab: int
    threads: int
    speed: float          # relative to the reference box (1.0)
    precision: str = "no"  # the training config's mixed_precision: no | bf16 | fp16 (a GPU without bf16)
    answer_precision: str = "no"  # the target answering the prompts: bf16 only where this CPU's bf16 GEMM pays

    def __post_init__(self):
        if self.precision not in ("no", "bf16", "fp16"):
            raise ValueError(f"precision {self.precision!r}: accepted no, bf16, fp16 (a GPU without bf16)")
        if self.answer_precision not in ("no", "bf16"):
            raise ValueError(f"answer_precision {self.answer_precision!r}: accepted no, bf16")

    @classmethod
    def for_budget(cls, minutes: float, gpu: bool, speed: float = 1.0, precision: str = "no",
                   answer_precision: str | None = None) -> "Plan":
        if minutes < 2:
            raise ValueError(f"--minutes {minutes}: the pipeline needs at least 2 minutes")
        if not speed > 0:
            raise ValueError(f"speed {speed}: must be > 0")
        seconds, speed = minutes * 60, 25.0 if gpu else speed
        # 35% answering at ~0.5 conversations/s (128 new tokens, batch 32; x BF16_ANSWER_GAIN in bf16), 40% training,
        # 15% bench at ~40 s a prompt (its four runs: the head, plain decoding, transformers, the head + lookup; the
        # first three took ~25 s on the reference box; on a 2-core AVX2 box rated 1.32-1.40x by its GEMM the four took
        # 37-41 s, 2026-11-25: the bench decodes one sequence on one thread, whose speed a faster GEMM does not raise,
        # so the bench shrinks on a slower box but does not grow on a faster one). On a GPU the bench is not 25x faster:
        # transformers' generate (one of its four runs) is bound by ~15-20 ms of launches a token there, so a prompt of
        # 256 tokens costs ~12 s (on an H100 a 5-minute plan of 45 eval prompts spent over 5 minutes in the bench alone,
        # 2026-11-24)
        if answer_precision is None:  # fp16 (a GPU's): the engine's default there
            answer_precision = "no" if precision == "fp16" else precision
        answer_rate = 0.5 * speed * (BF16_ANSWER_GAIN if answer_precision == "bf16" and not gpu else 1.0)
        prompts = int(min(2000, max(16, 0.35 * seconds * answer_rate)))
        eval_prompts = int(min(80, max(2, 0.15 * seconds / (12.0 if gpu else 40 / min(speed, 1.0)))))
        return cls(prompts, 256 if gpu else 128, eval_prompts, 0.40 * seconds, 8192, 2, round(speed, 3), precision,
                   answer_precision)

    @property
    def answer_dtype(self) -> str:
        """The dtype the target answers the training prompts in: bf16 where this CPU runs bf16 GEMMs fast (native
        bf16, where the head trains in bf16 with the frozen target in bf16 too), else the engine's default."""
        return "bfloat16" if self.answer_precision == "bf16" else "auto"

    def train_steps(self, tokens_per_row: float) -> int:
        """Optimizer steps at batch 4 that fit train_seconds at ~200 tokens/s x speed (8k draft vocab, fp32,
        2 threads on the reference box), 1.5x that under bf16."""
        rate = 200.0 * self.speed * (BF16_TRAIN_GAIN if self.precision == "bf16" else 1.0)
        return max(10, int(self.train_seconds * rate / (4 * max(tokens_per_row, 1.0))))


def pick_speed(speed: str | float, minutes: float, state: dict, gpu: bool) -> float:
    """The plan's speed factor: fixed on a GPU; given; kept from the run being resumed (its finished stages fit
    that plan); else measured, recording the GEMM rate in state."""
    if gpu:
        return 25.0
    if speed != "auto":
        return float(speed)
    if state.get("minutes") == minutes and "speed" in state.get("plan", {}):
        return state["plan"]["speed"]
    gflops = measure_gflops(threads=2)
    factor = min(gflops / REFERENCE_GFLOPS, 4.0)  # beyond 4x the plan's floors and caps dominate anyway
    state["gflops"] = round(gflops, 1)
    print(f"[quickstart] this CPU: {gflops:.0f} GFLOP/s fp32 GEMM on 2 threads = {factor:.2f}x the box the plan was "
          f"measured on; sizes scaled to fit {minutes:g} minutes", flush=True)
    return factor


def pick_precision(precision: str, minutes: float, state: dict, gpu: bool) -> tuple[str, str]:
    """(training precision, answering precision): on a GPU the one given, auto being the trainer's rule there (the
    head and target in bf16 from sm_80, fp16 before; precision.py; bf16 asked for before sm_80 refused now, not
    after the answers), answering in the engine's default (the same half precision); kept from the run being
    resumed; else the training one given or, for auto, bf16 where this CPU's bf16 GEMM is >= BF16_MIN_GAIN x its
    fp32 GEMM. The target answers in bf16 only where that measure says bf16 pays: a forced --mixed-precision bf16
    on a CPU that emulates bf16 trains as told, but answering (no time cap) in emulated bf16 would take ~100x as
    long."""
    if gpu:
        from toolkit.gpu_half import has_bf16, refuse_bf16

        if precision == "bf16":
            refuse_bf16("--mixed-precision bf16", "give auto (fp16 there) or no")
        return ("bf16" if has_bf16() else "fp16") if precision == "auto" else precision, "no"
    if precision == "no":
        return "no", "no"
    plan = state.get("plan", {})
    if precision == "auto" and state.get("minutes") == minutes and "precision" in plan:
        return plan["precision"], plan.get("answer_precision", plan["precision"])
    fp32 = state.get("gflops") or measure_gflops(threads=2)
    bf16 = measure_gflops(threads=2, dtype="bfloat16")
    state["bf16_gflops"] = round(bf16, 1)
    pays = "bf16" if bf16_pays(fp32, bf16) else "no"
    chosen = pays if precision == "auto" else precision
    print(f"[quickstart] bf16 GEMM {bf16:.0f} GFLOP/s = {bf16 / fp32:.2f}x fp32: the head trains in "
          f"{'bf16 (target too)' if chosen == 'bf16' else 'fp32'}, the target answers in "
          f"{'bf16' if pays == 'bf16' else 'fp32'}", flush=True)
    return chosen, pays


def _run(argv: list[str], ok: tuple[int, ...] = (0,)) -> None:
    from toolkit.cli import main

    print(f"\n$ toolkit {' '.join(argv)}", flush=True)
    rc = main(argv)
    if rc not in ok:
        raise RuntimeError(f"`toolkit {argv[0]}` failed (exit {rc}); fix the cause and rerun: finished stages "
                           "are kept")


def _jsonl(path: Path, rows: list[dict]) -> None:
    write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


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
    state.update(plan=asdict(plan), minutes=args.minutes, device=device)
    dev = ["--device", device]
    t_all = time.perf_counter()

    def stage(name: str, output: Path, run, done: bool | None = None) -> None:
        """Run a stage unless its output exists (done overrides the check)."""
        n = len(state["stages"]) + 1
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
    answered = regen.is_file() and sum(1 for _ in regen.open()) >= plan.prompts
    stage("regenerate", regen, done=answered, run=lambda: _run(
        ["regenerate", "--data", str(out / "prompts.jsonl"), "--out", str(regen), "--max-new-tokens",
         str(plan.max_new_tokens), "--batch-size", "32", "--max-len", "1024", "--threads", str(plan.threads), *dev,
         "--dtype", plan.answer_dtype], ok=(0, 1)))  # 1: a few conversations got no answer; the rest go on
    vocab_map = out / "maps" / f"vocab_map_{plan.draft_vocab}.safetensors"
    stage("token map", vocab_map, lambda: _run(
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
    stage("bench", out / "bench.json", lambda: _run(
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
