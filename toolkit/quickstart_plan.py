"""The quickstart's plan: how many prompts the target answers, how long the head trains and how many prompts the
bench runs so that `toolkit quickstart --minutes N` fits N minutes, from rates measured on a reference box
scaled by this machine's measured GEMM speed, and the precision the head trains and the target answers in."""
from __future__ import annotations

from dataclasses import dataclass

from toolkit.cpu_speed import bf16_pays, measure_gflops

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
    # resumed (the same budget, and auto or the precision it chose): its choices, not a new GEMM timing that may fall
    # on the other side of BF16_MIN_GAIN on a noisy machine and plan another run
    if state.get("minutes") == minutes and "precision" in plan and precision in ("auto", plan["precision"]):
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
