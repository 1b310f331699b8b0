"""Join the JSONs of `toolkit bench --shard I/N` runs into one report over the whole prompt set, as if one
run had answered every prompt: τ and acceptance rates weighted by verify steps, counts and seconds summed,
tokens/s = all tokens / all wall seconds, speedups recomputed from those, greedy checks true only if every
shard's is. The merged JSON has the `toolkit bench` schema (docs/formats.md section 11) plus `shards` and
`merged_from`, so benchmarks/bench_table.py reads it; a PNG is written beside it.

    for i in 0 1 2 3 4 5 6 7 8 9; do toolkit bench ... --shard $i/10 --out shard$i.json; done
    python benchmarks/merge_bench.py shard*.json --out mt_bench.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SAME = ("draft", "head", "token_map", "draft_vocab_size", "target", "tree", "sampling", "sample_draft", "lookup",
        "prompts_sha256", "limit", "seed", "dtype", "fp32_lm_head", "chat_template_kwargs")
# what a JSON from before the field existed ran with (dtype: not recorded then)
DEFAULTS = {"sample_draft": False, "lookup": None, "dtype": None, "fp32_lm_head": False, "chat_template_kwargs": {}}
RUNS = ("speculative", "baseline", "hf_generate", "prompt_lookup", "endpoint")
ENDPOINT = ("kind", "model")  # --compare-endpoint's server: one kind serving one model (replicas may differ in url)


def weighted(parts: list[dict], key: str) -> float:
    steps = sum(p["verify_steps"] for p in parts)
    return sum(p[key] * p["verify_steps"] for p in parts) / steps if steps else 0.0


def merge_counts(parts: list[dict]) -> dict:
    """{tau, verify_steps, tokens} entries (per category, per turn)."""
    return {"tau": weighted(parts, "tau"), "verify_steps": sum(p["verify_steps"] for p in parts),
            "tokens": sum(p["tokens"] for p in parts)}


def merge_grouped(groups: list[dict], where: list[str], what: str) -> dict:
    """{name: counts} dicts of the shards (a name may be missing from some) -> one such dict."""
    for g, w in zip(groups, where):
        bad = [k for k, v in g.items() if not isinstance(v, dict) or "verify_steps" not in v]
        if bad:
            raise ValueError(f"{w}: {what} {bad} carry no verify_steps / tokens (written by an older toolkit "
                             "bench); rerun that shard with the current one")
    names = sorted({k for g in groups for k in g})
    return {k: merge_counts([g[k] for g in groups if k in g]) for k in names}


def merge_run(parts: list[dict], where: list[str]) -> dict:
    """Summaries of one engine or transformers run, one per shard -> the run over every shard."""
    out = {}
    for key in ("requests", "tokens", "verify_steps", "accepted_from_lookup", "draft_tokens"):
        if all(key in p for p in parts):
            out[key] = sum(p[key] for p in parts)
    out["tau"] = weighted(parts, "tau")
    if "draft_tokens" in out:  # accepted draft tokens are (tau - 1) x verify steps in each shard
        accepted = sum((p["tau"] - 1) * p["verify_steps"] for p in parts)
        out["draft_acceptance_rate"] = accepted / out["draft_tokens"] if out["draft_tokens"] else None
    if "accept_rate_by_position" in parts[0]:
        depth, steps = max(len(p["accept_rate_by_position"]) for p in parts), out["verify_steps"]
        rates = [p["accept_rate_by_position"] + [0.0] * (depth - len(p["accept_rate_by_position"])) for p in parts]
        out["accept_rate_by_position"] = [  # share of all verify steps accepting >= k + 1 draft tokens
            sum(r[k] * p["verify_steps"] for r, p in zip(rates, parts)) / steps if steps else 0.0
            for k in range(depth)]
        width = max(len(p["accepted_length_histogram"]) for p in parts)
        out["accepted_length_histogram"] = [sum(p["accepted_length_histogram"][a] for p in parts
                                                if a < len(p["accepted_length_histogram"])) for a in range(width)]
    if "seconds" in parts[0]:
        out["seconds"] = {k: None if any(p["seconds"][k] is None for p in parts)
                          else round(sum(p["seconds"][k] for p in parts), 4) for k in parts[0]["seconds"]}
    out["wall_seconds"] = round(sum(p["wall_seconds"] for p in parts), 4)
    out["tokens_per_second"] = out["tokens"] / out["wall_seconds"] if out["wall_seconds"] > 0 else 0.0
    if "logits_dtype" in parts[0]:  # transformers' (hf_generate); the shards' dtype is checked equal already
        out["logits_dtype"] = parts[0]["logits_dtype"]
    if "per_turn" in parts[0]:
        out["per_turn"] = merge_grouped([p["per_turn"] for p in parts], where, "per_turn")
    if "prompt_lookup_num_tokens" in parts[0]:
        lengths = [p.get("prompt_lookup_num_tokens") for p in parts]
        if any(n != lengths[0] for n in lengths):
            raise ValueError(f"--compare-pld lengths {lengths} of {where} differ: merge shards of one configuration "
                             "only")
        out["prompt_lookup_num_tokens"] = lengths[0]
    for key in ENDPOINT:
        if key in parts[0]:
            if any(p.get(key) != parts[0][key] for p in parts):
                raise ValueError(f"--compare-endpoint {key}s {[p.get(key) for p in parts]} of {where} differ: merge "
                                 "shards answered by one kind of server serving one model only")
            out[key] = parts[0][key]
    if "url" in parts[0]:  # one server, or replicas of it (the shards run side by side)
        urls = list(dict.fromkeys(p["url"] for p in parts))
        out["url"] = urls[0] if len(urls) == 1 else urls
    return out


def all_true(parts: list[dict], key: str, into: dict) -> None:
    """A greedy-identity check joined over shards: true only if every shard's is (left out if none has it)."""
    if any(key in p for p in parts):
        into[key] = all(p.get(key) is True for p in parts)


def check_shards(shards: list, where: list[str], partial: bool) -> None:
    """The files' --shard values must be different shards I/N of one N, all N of them unless `partial`."""
    if len(shards) == 1 and shards[0] is None:
        return
    dup = sorted({s for s in shards if s is not None and shards.count(s) > 1})
    if dup or None in shards:
        raise ValueError(f"shards {shards} of {where}: each file must be a different --shard of the set")
    split = [tuple(int(x) for x in s.split("/")) for s in shards]
    counts = sorted({n for _, n in split})
    if len(counts) > 1:
        raise ValueError(f"shards {shards} of {where} split the prompts {counts} ways: merge shards of one N")
    missing = sorted(set(range(counts[0])) - {i for i, _ in split})
    if missing and not partial:
        raise ValueError(f"shards {[f'{i}/{counts[0]}' for i in missing]} are missing: the merge would not be one "
                         "run over every prompt; give every shard's JSON, or --partial for a figure over these "
                         "shards only")


def merge(reports: list[dict], where: list[str], partial: bool = False) -> dict:
    first = reports[0]
    for key in SAME:
        for r, w in zip(reports[1:], where[1:]):
            if r.get(key, DEFAULTS.get(key)) != first.get(key, DEFAULTS.get(key)):
                raise ValueError(f"{w}: {key} {r.get(key)!r} differs from {where[0]}'s {first.get(key)!r}; merge "
                                 "shards of one configuration only")
    shards = [r.get("shard") for r in reports]
    check_shards(shards, where, partial)
    out = {k: first.get(k, DEFAULTS.get(k)) for k in SAME}
    out.update({"shards": shards, "merged_from": where, "prompts": sum(r["prompts"] for r in reports),
                "probe_agreement": sum(r["probe_agreement"] for r in reports) / len(reports)})
    old_endpoint = [w for r, w in zip(reports, where) if "endpoint" in r
                    and any(not isinstance(v, dict) for v in r["endpoint"].get("per_turn", {}).values())]
    if old_endpoint:  # per_turn {turn: tau}, no counts: the server's run cannot be joined exactly; the rest can
        print(f"merge_bench: the --compare-endpoint runs of {old_endpoint} predate per-turn counts: the merged report "
              "leaves the endpoint out", file=sys.stderr)
        reports = [{k: v for k, v in r.items() if "endpoint" not in k} for r in reports]
    for run in RUNS:
        have = [run in r for r in reports]
        if any(have) and not all(have):
            raise ValueError(f"{run} is in some shards and not in others ({have}): run every shard with the same "
                             "flags")
        if all(have):
            out[run] = merge_run([r[run] for r in reports], where)
    out["per_category"] = merge_grouped([r["per_category"] for r in reports], where, "per_category")
    out["per_turn"] = merge_grouped([r["per_turn"] for r in reports], where, "per_turn")
    spec = out["speculative"]["tokens_per_second"]
    if "baseline" in out:
        out["speedup_vs_baseline"] = spec / out["baseline"]["tokens_per_second"]
    if "hf_generate" in out:
        out["speedup_vs_hf"] = spec / out["hf_generate"]["tokens_per_second"]
        if "prompt_lookup" in out:
            out["prompt_lookup"]["speedup_vs_hf"] = (out["prompt_lookup"]["tokens_per_second"]
                                                     / out["hf_generate"]["tokens_per_second"])
    if "endpoint" in out and out["endpoint"]["tau"]:
        out["tau_vs_endpoint"] = out["speculative"]["tau"] / out["endpoint"]["tau"]
    for key in ("greedy_identical_to_baseline", "greedy_identical_to_hf", "greedy_identical_to_prompt_lookup",
                "greedy_identical_to_endpoint"):
        all_true(reports, key, out)
    for key in ("greedy_answers_differing_from_baseline", "greedy_answers_differing_from_hf",
                "greedy_answers_differing_from_endpoint"):
        if all(key in r for r in reports):  # shards written before the count have the boolean alone
            out[key] = sum(r[key] for r in reports)
    if any("sweep" in r for r in reports):
        # an entry's lookup length; older reports ran every entry with the main run's --lookup
        trees = [[(s["num_steps"], s["topk"], s["num_draft_tokens"], s.get("sample_draft", False),
                   s.get("lookup", (r.get("lookup") or {}).get("num_tokens", 0)))
                  for s in r.get("sweep", [])] for r in reports]
        if any(t != trees[0] for t in trees):
            raise ValueError(f"--sweep differs between shards: {trees}")
        for r, w in zip(reports, where):
            if any("verify_steps" not in s for s in r["sweep"]):
                raise ValueError(f"{w}: sweep entries carry no verify_steps / tokens (written by an older toolkit "
                                 "bench); rerun that shard with the current one")
        out["sweep"] = [{**dict(zip(("num_steps", "topk", "num_draft_tokens", "sample_draft", "lookup"), t)),
                         **merge_run([r["sweep"][i] for r in reports], where)} for i, t in enumerate(trees[0])]
        for i, entry in enumerate(out["sweep"]):  # each tree's text against the main run's, in every shard
            all_true([r["sweep"][i] for r in reports], "greedy_identical_to_speculative", entry)
    return out


def main() -> None:
    from toolkit.atomic import write_text
    from toolkit.infer.bench_report import write_png

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", type=Path, help="toolkit bench --shard I/N --out JSON files")
    p.add_argument("--out", type=Path, required=True, help="merged JSON; a PNG is written beside it")
    p.add_argument("--partial", action="store_true", help="merge some shards of a set (the figure is then over "
                   "those shards' prompts only; `shards` lists them)")
    args = p.parse_args()
    if args.out.suffix.lower() == ".png":
        p.error(f"--out {args.out}: give the JSON's name; the PNG is written beside it with .png")
    merged = merge([json.loads(f.read_text()) for f in args.files], [str(f) for f in args.files], args.partial)
    write_text(args.out, json.dumps(merged, indent=2) + "\n")
    write_png(args.out.with_suffix(".png"), merged["speculative"])
    for run in RUNS:
        if run in merged:
            print(f"{run}: tau {merged[run]['tau']:.3f}, {merged[run]['tokens_per_second']:.1f} tok/s over "
                  f"{merged[run]['tokens']} tokens")
    for s in merged.get("sweep", []):
        print(f"tree {s['num_steps']},{s['topk']},{s['num_draft_tokens']} lookup {s['lookup']}: tau {s['tau']:.3f}, "
              f"{s['tokens_per_second']:.1f} tok/s")
    print(f"wrote {args.out} and {args.out.with_suffix('.png')} ({merged['prompts']} prompts, "
          f"{len(args.files)} shards)")


if __name__ == "__main__":
    main()
