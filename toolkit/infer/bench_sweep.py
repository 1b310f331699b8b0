"""`toolkit bench --sweep`: a grid of trees (and lookup branches) run on the same prompts as the main run, each
checked to give its text when greedy, and the fastest named."""
from __future__ import annotations

from toolkit.infer import lookup
from toolkit.infer.tree import TreeConfig


def parse_sweep(text: str, branch: lookup.LookupConfig | None = None,
                max_ngram: int = 3, min_ngram: int = 1) -> list[tuple[TreeConfig, lookup.LookupConfig | None]]:
    """'S,K,N;S,K,N,L' -> [(tree, lookup branch or None)]: an entry's fourth number is its lookup branch's
    length (0 = none); an entry of three takes the run's --lookup (`branch`)."""
    entries = []
    for item in (x for x in text.split(";") if x.strip()):
        try:
            numbers = [int(x) for x in item.split(",")]
        except ValueError:
            numbers = []
        if len(numbers) not in (3, 4):
            raise ValueError(f"--sweep {text!r}: entry {item.strip()!r} is not num_steps,topk,num_draft_tokens "
                             "[,lookup]; separate entries with ';'")
        if len(numbers) == 4 and numbers[3] < 0:
            raise ValueError(f"--sweep entry {item.strip()!r}: the lookup length must be >= 0 (0 = no branch)")
        own = branch if len(numbers) == 3 else (
            lookup.LookupConfig(numbers[3], max_ngram, min_ngram) if numbers[3] else None)
        try:
            entries.append((TreeConfig(*numbers[:3]), own))
        except ValueError as e:  # TreeConfig names the run's flags, not this entry
            raise ValueError(f"--sweep entry {item.strip()!r}: {e}") from None
    if not entries:
        raise ValueError(f"--sweep {text!r} names no tree; give num_steps,topk,num_draft_tokens[,lookup] entries "
                         "separated by ';', e.g. '3,1,4;5,8,32'")
    return entries


def run_sweep(report: dict, sweep: list, run, depth, sampled, greedy: bool, spec_answers: list) -> None:
    """report["sweep"]: one entry per (tree, branch) of `sweep`, run(tree, branch) -> (results, answers, wall)."""
    from toolkit.infer.metrics import summarize

    report["sweep"] = []
    for cfg, own in sweep:
        res, answers, w = run(cfg, own)
        s = summarize(res, w, depth(cfg, own))
        report["sweep"].append({**vars(cfg), "sample_draft": sampled(cfg),
                                "lookup": own.num_tokens if own is not None else 0, **s})
        if greedy:  # every tree must give the main run's text (which the baseline checks)
            report["sweep"][-1]["greedy_identical_to_speculative"] = answers == spec_answers
    best = max(report["sweep"], key=lambda r: r["tokens_per_second"])
    print(f"best of sweep: num_steps {best['num_steps']} topk {best['topk']} num_draft_tokens "
          f"{best['num_draft_tokens']} lookup {best['lookup']}: tau {best['tau']:.2f}, "
          f"{best['tokens_per_second']:.1f} tok/s")
