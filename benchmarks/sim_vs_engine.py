"""Simulated tau (training's teacher-forced TTT accuracies) against real engine tau, on the same prompts and
the same target continuations: each turn's prompt (turn 2 after the model's own turn-1 answer) goes to
toolkit.train.evaluate, where the engine drafts a greedy chain of --steps tokens and the head is unrolled over
prompt + the engine's answer as in training; the replayed tau recomputes the engine's accepted lengths from
that pass (equal to the engine's when training and serving agree).

    python benchmarks/sim_vs_engine.py --draft out/eagle3/draft --prompts ../shared/data/eval/mt_bench.jsonl \
        --limit 20 --steps 7 --max-new-tokens 256 --threads 2 --out benchmarks/sim_vs_engine.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch



def main() -> None:
    from toolkit.infer.prompts import answer_turns, read_prompts
    from toolkit.infer.loading import load
    from toolkit.infer.engine import Engine
    from toolkit.infer.sampling import SamplingParams
    from toolkit.train.evaluate import evaluate

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--draft", required=True)
    p.add_argument("--prompts", required=True)
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--steps", type=int, default=7)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default="sim_vs_engine.json")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load(args.draft, None, None, "cpu", "float32", "torch")  # the target the draft records
    tok, target, head = loaded.tok, loaded.target, loaded.head
    prompts = read_prompts(args.prompts, args.limit)
    plain = Engine(target, None, None, 4096)
    params = SamplingParams(0.0, max_new_tokens=args.max_new_tokens)
    rows = []

    def generate(ids, _):
        out = plain.generate(ids, params, {tok.eos_token_id}).tokens
        rows.append({"input_ids": torch.tensor(ids + out),
                     "loss_mask": torch.tensor([0] * len(ids) + [1] * len(out))})
        return out

    answer_turns(tok, prompts, generate)
    res = evaluate(head, target, rows, args.steps, 0.8, args.max_new_tokens, {tok.eos_token_id})
    report = {"draft": args.draft, "prompts": args.prompts, "turns": len(rows), "steps": args.steps,
              "simulated_tau": res["eval_simulated_tau"], "acc_i": res["eval_acc"],
              "engine_tau": res["eval_engine_tau"], "engine_accept_rate_by_position": res["eval_accept_rate_by_position"],
              "ratio_engine_over_simulated": res["eval_engine_tau"] / res["eval_simulated_tau"],
              "replayed_tau": res["eval_replayed_tau"], "replay_differing_turns": res["eval_replay_differing_rows"]}
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
