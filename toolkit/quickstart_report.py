"""DIR/report.md for `toolkit quickstart`: what each stage did and took, with its figures and PNGs (token
coverage, training curves, acceptance by position, speed-up)."""
from __future__ import annotations

import json
from pathlib import Path

from toolkit.atomic import atomic_path, write_text
from toolkit.train.plots import plot_training
from toolkit.train.tracking import read_metrics


def plot_speedup(bench: dict, out: Path) -> Path:
    from matplotlib.figure import Figure

    names = ["transformers generate", "engine, no draft", "engine + EAGLE-3"]
    speeds = [bench["hf_generate"]["tokens_per_second"], bench["baseline"]["tokens_per_second"],
              bench["speculative"]["tokens_per_second"]]
    grafted = lookup_run(bench)
    if grafted is not None:
        names.append(f"engine + EAGLE-3\n+ lookup (tau {grafted['tau']:.2f})")
        speeds.append(grafted["tokens_per_second"])
    fig = Figure(figsize=(6.5, 3.2 + 0.5 * (grafted is not None)))
    ax = fig.subplots()
    bars = ax.barh(names, speeds, color=["#999999", "#6699cc", "#cc6633", "#cc9933"][:len(names)])
    for bar, s in zip(bars, speeds):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {s:.1f} ({s / speeds[0]:.2f}x)",
                va="center", fontsize=8)
    ax.set(xlabel="generated tokens / s", title=f"decode speed, tau = {bench['speculative']['tau']:.2f}")
    ax.set_xlim(0, max(speeds) * 1.35)
    fig.subplots_adjust(left=0.3, right=0.97, bottom=0.17, top=0.88)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    return out


def lookup_run(bench: dict) -> dict | None:
    """The bench's sweep run with a prompt-lookup branch, if it had one."""
    return next((sw for sw in bench.get("sweep", []) if sw.get("lookup")), None)


def write_report(out: Path, state: dict, steps: int) -> Path:
    prep = json.loads((out / "prepared" / "toolkit_prepare.json").read_text())
    cov = json.loads((out / "maps" / "coverage.json").read_text())
    bench = json.loads((out / "bench.json").read_text())
    metrics = read_metrics(out / "train" / "metrics.jsonl")
    last = [r for r in metrics if "loss" in r][-1]
    evals = [r for r in metrics if "eval_engine_tau" in r]
    plot_training(out / "train" / "metrics.jsonl", out / "training.png")
    plot_speedup(bench, out / "speedup.png")
    s, b, plan = bench["speculative"], bench["baseline"], state["plan"]
    size = str(plan["draft_vocab"])
    speed = (f"a machine {plan['speed']:.2f}x as fast as the reference box" +
             (f" (fp32 GEMM measured at {state['gflops']:.0f} GFLOP/s on 2 threads)" if "gflops" in state else ""))
    precision = {"bf16": "bf16 (autocast; the frozen target in bf16 too)", "fp16": "fp16 (autocast with loss scaling; "
                 "the frozen target in fp16 too)"}.get(plan.get("precision"), "fp32") + (
        f", the bf16 GEMM measured at {state['bf16_gflops']:.0f} GFLOP/s" if "bf16_gflops" in state else "")
    trained = f"{last['step']}" + (f" (of {steps} planned; the time budget ended it)" if last["step"] < steps else "")
    took = {name: "skipped (done before)" if v.get("skipped") else f"{v['seconds']:.0f} s"
            for name, v in state["stages"].items()}
    stages = "\n".join(f"| {name} | {t} |" for name, t in took.items())
    rates = ", ".join(f"{r:.2f}" for r in s["accept_rate_by_position"])
    hf = bench["hf_generate"]["tokens_per_second"]
    g = lookup_run(bench)
    grafted_row = "" if g is None else (
        f"| ... + a prompt-lookup branch (chain of {g['num_steps']}, `--lookup {g['lookup']}`) | "
        f"{g['tokens_per_second']:.1f} | {g['tokens_per_second'] / hf:.2f}x |\n")
    grafted_text = "" if g is None else f"""
With a prompt-lookup branch grafted onto the head's drafts (`toolkit bench/serve --num-steps {g['num_steps']} --topk 1
--num-draft-tokens {g['num_draft_tokens']} --lookup {g['lookup']}`: what followed the text's last 1-3 tokens where they
occurred before, verified in the same forward) tau is **{g['tau']:.2f}**; the branch alone proposed
{g['accepted_from_lookup']} of the accepted draft tokens. Greedy text identical to the head's run:
{g.get('greedy_identical_to_speculative')}.
"""
    text = f"""# toolkit quickstart report

Target: the embedded SmolLM2-135M-Instruct on {state['device']}; budget {state['minutes']:g} minutes, sizes
planned for {speed}.
Every stage ran the `toolkit` command it printed on the console; rerunning `toolkit quickstart --out {out}`
skips finished stages.

| stage | time |
|---|---|
{stages}

## Data

{plan['prompts']} prompts from the project's own topic set (`toolkit/data/topics.py`), answered by the
target itself (greedy, up to {plan['max_new_tokens']} new tokens per turn): {prep['kept']} conversations,
{prep['tokens']:,} tokens, {prep['assistant_tokens']:,} of them assistant tokens (the loss mask).

## Token map

The {size} most frequent assistant tokens cover {cov['sizes'].get(size, float('nan')):.1%} of the
{cov['total_tokens']:,} counted ({cov['distinct_tokens']:,} distinct ids of {cov['vocab_size']:,}).

![coverage](maps/coverage.png)

## Training

EAGLE-3 head, one decoder layer, training-time test over {len(last['acc_i'])} steps, {trained} optimizer steps
at batch 4 in {precision}: final loss {last['loss']:.2f}, acc_i {', '.join(f'{a:.2f}' for a in last['acc_i'])}, simulated
tau on the training batch {last['simulated_tau']:.2f}""" + (f"""; on held-out rows: simulated tau
{evals[-1]['eval_simulated_tau']:.2f}, engine tau {evals[-1]['eval_engine_tau']:.2f} (replayed from the training
pass: {evals[-1].get('eval_replayed_tau', float('nan')):.2f})""" if evals else "") + f""".

![training curves](training.png)

## Bench (held-out prompts, greedy, chain of {bench['tree']['num_steps']} draft tokens)

| | tokens/s | speed-up |
|---|---|---|
| transformers `generate` | {hf:.1f} | 1.00x |
| our engine, no draft | {b['tokens_per_second']:.1f} | {b['tokens_per_second'] / hf:.2f}x |
| our engine + the EAGLE-3 head | {s['tokens_per_second']:.1f} | {bench['speedup_vs_hf']:.2f}x |
{grafted_row}
tau (tokens per target forward, bonus included) **{s['tau']:.2f}** over {s['verify_steps']} verify steps on
{bench['prompts']} prompts; acceptance by draft position: {rates}. Greedy text identical to plain decoding:
{bench.get('greedy_identical_to_baseline')}; to transformers: {bench.get('greedy_identical_to_hf')}.
{grafted_text}

![acceptance](bench.png)
![speed-up](speedup.png)

## Use it

```bash
toolkit serve --draft {out / 'draft'}
toolkit serve --draft {out / 'draft'} --num-steps 3 --topk 1 --num-draft-tokens 4 --lookup 10
toolkit bench --draft {out / 'draft'} --prompts your_prompts.jsonl --baseline --compare-hf
```
"""
    write_text(out / "report.md", text)
    return out / "report.md"
