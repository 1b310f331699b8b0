"""A markdown table from `toolkit bench --out` JSON files (one row per run, plus one per --sweep entry), for
benchmarks/RESULTS.md; ratios of τ against a reference row when --reference names one.

    python benchmarks/bench_table.py runs/bench/*.json [--reference runs/bench/eagle.json]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def rows(report: dict, label: str) -> list[dict]:
    t, s = report["tree"], report["speculative"]
    main_lookup = (report.get("lookup") or {}).get("num_tokens", 0)

    def name(tree: dict, lookup: int) -> str:
        return (f"{tree['num_steps']} steps, topk {tree['topk']}, {tree['num_draft_tokens']} tokens"
                + (f" + lookup {lookup}" if lookup else ""))

    tree = name(t, main_lookup)
    out = [{"label": label, "head": report.get("head", "?"), "vocab": report.get("draft_vocab_size"), "tree": tree,
            "tau": s["tau"], "tok_s": s["tokens_per_second"], "accept": s["accept_rate_by_position"],
            "baseline": (report.get("baseline") or {}).get("tokens_per_second"),
            }]
    for sw in report.get("sweep", []):
        out.append({**out[0], "tree": name(sw, sw.get("lookup", main_lookup)),
                    "tau": sw["tau"], "tok_s": sw["tokens_per_second"], "accept": None})
    return out


def table(files: list[Path], reference: Path | None = None) -> str:
    ref_tau = None
    if reference is not None:
        ref_tau = json.loads(reference.read_text())["speculative"]["tau"]
    lines = ["| run | head | draft vocab | tree | τ | tok/s | vs plain | accept by position |"
             + (" τ / reference |" if ref_tau else ""),
             "|---|---|---|---|---|---|---|---|" + ("---|" if ref_tau else "")]
    for f in files:
        report = json.loads(f.read_text())
        for r in rows(report, f.stem):
            accept = ", ".join(f"{a:.2f}" for a in r["accept"][:5]) if r["accept"] else ""
            plain = f"{r['tok_s'] / r['baseline']:.2f}x" if r["baseline"] else ""
            line = (f"| {r['label']} | {r['head']} | {r['vocab']} | {r['tree']} | {r['tau']:.2f} | "
                    f"{r['tok_s']:.1f} | {plain} | {accept} |")
            lines.append(line + (f" {r['tau'] / ref_tau:.2f} |" if ref_tau else ""))
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", type=Path, help="toolkit bench --out JSON files")
    p.add_argument("--reference", type=Path, default=None, help="the run whose τ the last column divides by")
    args = p.parse_args()
    print(table(args.files, args.reference))


if __name__ == "__main__":
    main()
