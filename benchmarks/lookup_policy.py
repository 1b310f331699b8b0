"""How long should the prompt-lookup branch be? Replays greedy rounds of a head's chain + the lookup branch
under several branch-length policies, offline, on the answers the target really gives.

At T=0 every round is determined by where its root sits: the head's chain from row r (one teacher-forced TTT
pass, toolkit/train/ttt.py, as training's replayed tau) and the lookup proposal from the text up to r
(toolkit/infer/lookup.py). A round accepts max(head's run, branch's run) tokens, since both are prefixes of
the one greedy continuation, and verifies 1 + head nodes + the branch's nodes the head did not draft. With the
verify step's measured cost by node count (--step-ms, interpolated; this box's compiled SmolLM2 step) and the
head's draft cost (--draft-ms) each policy gets a predicted speed against plain decoding; the engine's real
figures come from `toolkit bench`.

    python benchmarks/lookup_policy.py --draft benchmarks/heads/smollm2-135m-eagle3-topics \
        --prompts ../shared/data/eval/gsm8k.jsonl --answers gsm8k_answers.jsonl --out gsm8k_policy.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from toolkit.atomic import atomic_path, write_text


def generate_rows(args, loaded) -> list[dict]:
    """Greedy answers turn by turn (the engine with the head's chain + lookup: the same text as plain decoding,
    faster), cached in --answers as {"prompt": ids, "answer": ids} per turn."""
    from toolkit.infer.prompts import answer_turns, read_prompts
    from toolkit.infer.engine import Engine
    from toolkit.infer.lookup import LookupConfig
    from toolkit.infer.sampling import SamplingParams
    from toolkit.infer.tree import TreeConfig

    path = Path(args.answers)
    if path.exists():
        return [json.loads(line) for line in path.read_text().splitlines()]
    tok = loaded.tok
    engine = Engine(loaded.target, loaded.head, TreeConfig(3, 1, 4), 4096, lookup=LookupConfig(10))
    params, rows = SamplingParams(0.0, max_new_tokens=args.max_new_tokens), []

    def generate(ids, _):
        out = engine.generate(ids, params, {tok.eos_token_id}).tokens
        rows.append({"prompt": ids, "answer": out})
        return out

    answer_turns(tok, read_prompts(args.prompts, args.limit), generate)
    write_text(path, "".join(json.dumps(r) + "\n" for r in rows))  # a killed run leaves no cut cache to reuse
    return rows


@torch.no_grad()
def head_chains(head, target, ids: list[int], steps: int) -> torch.Tensor:
    """[L, steps] target ids the head's greedy chain drafts from each row (row t: root token t + 1)."""
    from toolkit.train.ttt import unroll

    x = torch.tensor([ids])
    _, aux = target(x, aux_layers=head.aux_layers)
    step_logits, _ = unroll(head, target.embed_tokens, torch.cat(aux, -1), x, steps)
    return torch.stack([head.to_target(s[0].argmax(-1)) for s in step_logits], 1)


def run(chains: list[list[int]], truth: list[int], lookups: list[list[int]], policy, cost) -> tuple[int, float]:
    """One answer's rounds: chains[k] / lookups[k] = head chain and lookup proposal at the root truth[k]
    (truth: the root (last prompt token's successor, emitted by prefill) then the rest of the answer).
    Returns (verify rounds, predicted seconds)."""
    pos, rounds, seconds, state = 0, 0, 0.0, policy.start()
    while pos < len(truth) - 1:
        rest = truth[pos + 1:]
        head, branch = chains[pos], lookups[pos][:policy.length(state)]
        h = _run(head, rest)
        b = _run(branch, rest)
        shared = _run(branch, head)
        nodes = 1 + len(head) + len(branch) - shared
        take = max(h, b)
        state = policy.update(state, len(branch), b)
        seconds += cost(nodes)
        rounds += 1
        pos += take + 1
    return rounds, seconds


def _run(a: list[int], b: list[int]) -> int:
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


class Fixed:
    def __init__(self, n):
        self.n = self.longest = n
        self.name = f"fixed {n}"

    def start(self):
        return None

    def length(self, state):
        return self.n

    def update(self, state, proposed, accepted):
        return None


class Adaptive:
    """Grow after a branch accepted in full, shrink to what was accepted + `slack` otherwise (a round with no
    proposal leaves the length alone)."""

    def __init__(self, hi, lo=2, slack=1, grow=2):
        self.hi = self.longest = hi
        self.lo, self.slack, self.grow = lo, slack, grow
        self.name = f"adaptive {lo}..{hi} (+{slack}, x{grow})"

    def start(self):
        return self.hi

    def length(self, state):
        return state

    def update(self, state, proposed, accepted):
        if proposed == 0:
            return state
        if accepted >= proposed:
            return min(self.hi, max(state * self.grow, state + 1))
        return max(self.lo, min(self.hi, accepted + self.slack))


def simulate(rows: list[dict], every: list[list[list[int]]], policies: list, cost) -> dict:
    """rows: {"prompt", "answer"} ids per turn; every[i]: row i's head chains (head_chains(...).tolist());
    cost(nodes) -> ms of a round. Returns {policy name: [verify rounds, predicted ms]} over all rows."""
    from toolkit.infer.lookup import LookupConfig, propose

    longest = LookupConfig(max(1, *(p.longest for p in policies)))
    totals = {pol.name: [0, 0.0] for pol in policies}
    for row, chains in zip(rows, every):
        ids, P, truth = row["prompt"] + row["answer"], len(row["prompt"]), row["answer"]
        # round root = truth[k] = ids[P + k]: its head chain comes from row P + k - 1; a shorter branch is
        # the longest one cut (propose takes the same occurrence whatever the length)
        heads = [chains[P + k - 1] for k in range(len(truth))]
        looks = [propose(ids[:P + k + 1], longest) for k in range(len(truth))]
        for pol in policies:
            r, ms = run(heads, truth, looks, pol, cost)
            totals[pol.name][0] += r
            totals[pol.name][1] += ms
    return totals


def main() -> None:
    from toolkit.infer.loading import load

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--draft", required=True)
    p.add_argument("--prompts", required=True)
    p.add_argument("--answers", required=True, help="JSONL cache of the greedy answers (written when absent)")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--steps", type=int, default=3, help="the head's chain length")
    p.add_argument("--step-ms", default="1:17.2,2:20.2,3:23.0,4:21.9,5:25.9,8:32.0,10:33.9,12:36.0,14:38.6,16:39.7,"
                   "20:45.4,24:51.4,32:62.2,64:107.7", help="nodes:ms of a verify step (1 = plain decoding), "
                   "interpolated between the points")
    p.add_argument("--draft-ms", type=float, default=10.0, help="the head's drafting per round")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="lookup_policy.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load(args.draft, None, None, "cpu", "float32", "torch")
    rows = generate_rows(args, loaded)
    points = sorted((int(n), float(ms)) for n, ms in (x.split(":") for x in args.step_ms.split(",")))
    step_ms = lambda n: float(np.interp(n, [q[0] for q in points], [q[1] for q in points]))  # noqa: E731
    policies = [Fixed(0), Fixed(3), Fixed(5), Fixed(7), Fixed(10), Fixed(16)] + [
        Adaptive(hi, lo, slack) for hi in (10, 16) for lo in (1, 2, 3) for slack in (1, 2, 3)]
    cached = Path(f"{args.answers}.chains{args.steps}.pt")  # the head's passes take minutes: kept
    every = torch.load(cached) if cached.exists() else [
        head_chains(loaded.head, loaded.target, r["prompt"] + r["answer"], args.steps).tolist() for r in rows]
    with atomic_path(cached) as tmp:
        torch.save(every, tmp)
    totals = simulate(rows, every, policies, lambda n: args.draft_ms + step_ms(n))
    tokens = sum(len(r["answer"]) for r in rows)
    plain = (tokens - len(rows)) * step_ms(1)  # plain decoding: one step per token after prefill's
    report = {"draft": args.draft, "prompts": args.prompts, "turns": len(rows), "tokens": tokens,
              "cost_ms": {"verify_by_nodes": dict(points), "draft": args.draft_ms}, "policies": []}
    for name, (r, s) in totals.items():
        report["policies"].append({"policy": name, "rounds": r, "tau": (tokens - len(rows)) / r,
                                   "predicted_vs_plain": plain / s})
        print(f"{name:32s} rounds {r:6d}  tau {(tokens - len(rows)) / r:5.2f}  predicted {plain / s:5.2f}x plain")
    write_text(args.out, json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
