"""τ of two drafts over the same greedy answers, split by whether a turn ran into --max-new-tokens.

    python benchmarks/compare_answers.py A_answers.jsonl B_answers.jsonl --max-new-tokens 1024

Reads two `toolkit bench --answers` files of one prompt set at T=0 (the texts must be equal: greedy is lossless)
and prints τ(A), τ(B) and their ratio over all turns, the turns that ended on their own, and the turns cut at
the cap, with the share of tokens that complete a 16-token n-gram already in the same answer: a small greedy
target often loops in long answers, where a deep draft accepts whole repeats and τ says more about the loop
than about the head.
"""
from __future__ import annotations

import argparse
import json
import sys


def read(path: str) -> list[dict]:
    return [json.loads(line) for line in open(path) if line.strip()]


def repeated_share(texts: list[str], tok, n: int = 16) -> float:
    """Share of tokens that complete an n-gram seen earlier in the same text."""
    repeated = total = 0
    for text in texts:
        ids, seen = tok(text, add_special_tokens=False).input_ids, set()
        for i in range(n - 1, len(ids)):
            gram = tuple(ids[i - n + 1:i + 1])
            repeated += gram in seen
            seen.add(gram)
        total += len(ids)
    return repeated / total if total else 0.0


def split(a: list[dict], b: list[dict], cap: int) -> dict:
    """{group: {turns, tokens, tau_a, tau_b, ratio}} for all / ended / capped turns; τ = generated tokens after
    prefill's first, per verify step (as the bench counts it)."""
    if [r["question_id"] for r in a] != [r["question_id"] for r in b]:
        raise ValueError("the two files answer different questions (or in another order)")
    if any(x["choices"][0]["turns"] != y["choices"][0]["turns"] for x, y in zip(a, b)):
        raise ValueError("the answers differ: compare greedy (T=0) runs of one target and prompt set")
    turns = [(text, ta, tb) for x, y in zip(a, b)
             for text, ta, tb in zip(x["choices"][0]["turns"], x["speculative"], y["speculative"])]
    def capped(t: dict) -> bool:  # by why it ended; files written before `finish` was recorded: by its length
        return t["finish"] == "length" if t.get("finish") else t["tokens"] >= cap  # (a stop token at the cap: capped)

    groups = {"all": lambda t: True, "ended": lambda t: not capped(t), "capped": capped}
    out = {}
    for name, keep in groups.items():
        chosen = [(text, ta, tb) for text, ta, tb in turns if keep(ta)]
        tokens = sum(ta["tokens"] - 1 for _, ta, _ in chosen)
        steps_a, steps_b = (sum(t[i]["verify_steps"] for t in chosen) for i in (1, 2))
        tau_a = tokens / steps_a if steps_a else None
        tau_b = tokens / steps_b if steps_b else None
        out[name] = {"turns": len(chosen), "tokens": tokens, "tau_a": tau_a, "tau_b": tau_b,
                     "ratio": tau_a / tau_b if tau_a and tau_b else None, "texts": [text for text, _, _ in chosen]}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--max-new-tokens", type=int, required=True, help="the benches' --max-new-tokens")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder for the repeat share (default: none shown)")
    args = p.parse_args(argv)
    tok = None
    if args.tokenizer:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(args.tokenizer)
    for name, g in split(read(args.a), read(args.b), args.max_new_tokens).items():
        if not g["turns"]:
            print(f"{name:>6}: no turns")
            continue
        rep = f", {repeated_share(g['texts'], tok):.0%} of tokens repeat a 16-gram" if tok else ""
        print(f"{name:>6}: {g['turns']} turns, {g['tokens']} tokens: tau {g['tau_a']:.3f} / {g['tau_b']:.3f} = "
              f"{g['ratio']:.3f}{rep}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
