"""What `toolkit bench` shows of a run besides its JSON: the PNG beside it (acceptance by draft position, the
accepted-length histogram; benchmarks/merge_bench.py draws merged shards with it too) and the console summary."""
from __future__ import annotations

from pathlib import Path

from toolkit.atomic import atomic_path


def write_png(path: Path, summary: dict) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 3.6))
    a, b = fig.subplots(1, 2)
    rates = summary["accept_rate_by_position"]
    a.bar(range(1, len(rates) + 1), [r * 100 for r in rates])
    a.set(xlabel="draft position", ylabel="steps accepting it (%)", title=f"acceptance, tau = {summary['tau']:.2f}")
    hist = summary["accepted_length_histogram"]
    b.bar(range(len(hist)), hist)
    b.set(xlabel="draft tokens accepted per verify step", ylabel="verify steps", title="accepted length")
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.15, top=0.88, wspace=0.3)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)


def print_summary(report: dict, lookup_branch: bool) -> None:
    """τ, tokens/s, acceptance by position and by turn, and the comparisons the run made."""
    s = report["speculative"]
    print(f"tau {s['tau']:.2f} over {s['verify_steps']} verify steps, {s['tokens_per_second']:.1f} tok/s; per "
          f"position {[round(r, 2) for r in s['accept_rate_by_position']]}; per turn "
          f"{ {t: round(v['tau'], 2) for t, v in report['per_turn'].items()} }")
    if s.get("draft_acceptance_rate") is not None:  # vLLM's figure: accepted over checked draft tokens
        print(f"draft acceptance rate {s['draft_acceptance_rate']:.1%} ({s['draft_tokens']} draft tokens checked)")
    if lookup_branch:
        print(f"lookup branch: {s['accepted_from_lookup']} of {s['tokens'] - s['requests'] - s['verify_steps']} "
              "accepted draft tokens were proposed by prompt lookup alone")
    if "prompt_lookup" in report:
        pld = report["prompt_lookup"]
        print(f"prompt lookup: tau {pld['tau']:.2f}, {pld['tokens_per_second']:.1f} tok/s; per turn "
              f"{ {t: round(v['tau'], 2) for t, v in pld['per_turn'].items()} }")
    if "endpoint" in report:
        ep = report["endpoint"]
        print(f"endpoint ({ep['kind']}, {ep['url']}): tau {ep['tau']:.2f}, {ep['tokens_per_second']:.1f} tok/s; per "
              f"position {[round(r, 2) for r in ep['accept_rate_by_position']]}")
    for key in ("speedup_vs_baseline", "speedup_vs_hf", "greedy_identical_to_baseline", "greedy_identical_to_hf",
                "greedy_identical_to_prompt_lookup", "tau_vs_endpoint", "greedy_identical_to_endpoint"):
        if key in report:
            print(f"{key}: {report[key]:.2f}" if isinstance(report[key], float) else f"{key}: {report[key]}")
