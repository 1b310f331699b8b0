"""Training curves of a run from its metrics.jsonl: loss, accuracy per TTT step, and τ (simulated on the
training batch and on held-out rows, measured in the engine and replayed from training's pass at each eval)."""
from __future__ import annotations

from pathlib import Path

from toolkit.atomic import atomic_path
from toolkit.train.tracking import read_metrics


def plot_training(metrics: Path, out: Path) -> Path:
    recs = read_metrics(Path(metrics))
    if not any("loss" in r for r in recs):
        raise ValueError(f"{metrics}: no training steps logged yet")
    fig = training_figure(recs)
    with atomic_path(Path(out)) as tmp:
        fig.savefig(tmp, format="png", dpi=90)
    return Path(out)


def training_figure(recs: list[dict]):
    """The three panels over metrics.jsonl's records (at least one training step)."""
    from matplotlib.figure import Figure

    steps = [r for r in recs if "loss" in r]
    evals = [r for r in recs if "eval_engine_tau" in r]
    fig = Figure(figsize=(13, 3.8))
    a, b, c = fig.subplots(1, 3)
    dot = "." if len(steps) == 1 else None  # one logged step draws no line: a point shows it (a short run)
    a.plot([r["step"] for r in steps], [r["loss"] for r in steps], marker=dot)
    a.set(xlabel="step", ylabel="TTT loss (sum over steps, 0.8^i)", title="loss")
    for i in range(len(steps[0]["acc_i"])):
        b.plot([r["step"] for r in steps], [r["acc_i"][i] for r in steps], label=f"acc_{i}", lw=0.8, marker=dot)
    b.set(xlabel="step", ylabel="draft top-1 == target top-1", title="accuracy per TTT step")
    b.legend(fontsize=7, ncol=2)
    c.plot([r["step"] for r in steps], [r["simulated_tau"] for r in steps], lw=0.8, label="simulated (train batch)",
           marker=dot)
    c.plot([r["step"] for r in evals], [r["eval_simulated_tau"] for r in evals], "o-", label="simulated (held out)")
    c.plot([r["step"] for r in evals], [r["eval_engine_tau"] for r in evals], "s-", label="engine (held out)")
    c.plot([r["step"] for r in evals], [r.get("eval_replayed_tau") for r in evals], "x", label="replayed (held out)")
    c.set(xlabel="step", ylabel="tau", title="acceptance length")
    c.legend(fontsize=7)
    fig.subplots_adjust(left=0.06, right=0.99, bottom=0.14, top=0.9, wspace=0.28)
    return fig
