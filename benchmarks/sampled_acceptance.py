"""First-draft acceptance at T > 0, measured by the engine and predicted from the head, for both ways a chain
can propose: the head's top-1 (target-only verification, as EAGLE and SGLang: accepted with probability p(x))
and a draw from the head's tempered distribution q (`--sample-draft`: accepted with probability
sum_x min(p(x), q(x))). The engine answers the prompts as `toolkit bench` does (turn 2 after its own turn 1);
then one teacher-forced pass over each answer gives, at the root of each verify step the engine took, the
target's p and the head's q, and so the acceptance either proposal would expect there.

    python benchmarks/sampled_acceptance.py --draft benchmarks/heads/smollm2-135m-eagle3 \
        --prompts ../shared/data/eval/mt_bench.jsonl --shard 0/10 --temperature 1 --threads 1 [--sample-draft]

The engine's measured rate should match the prediction for the mode it ran in (a check that drafting and
verification do what the formula says); the other mode's prediction tells what switching would give on the
same text.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def main() -> None:
    from toolkit.infer.prompts import answer_turns, parse_shard, read_prompts
    from toolkit.infer.engine import Engine
    from toolkit.infer.loading import load
    from toolkit.infer.sampling import SamplingParams, seeded_generator, target_probs
    from toolkit.infer.tree import TreeConfig
    from toolkit.train.ttt import unroll

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--draft", required=True)
    p.add_argument("--prompts", required=True)
    p.add_argument("--shard", default=None, metavar="I/N")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--num-steps", type=int, default=5)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--sample-draft", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=None, help="JSON of the figures (default: print only)")
    args = p.parse_args()
    if args.temperature <= 0:
        raise ValueError("--temperature must be > 0: at 0 both proposals are the top-1")
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load(args.draft, None, None, "cpu", "float32", "torch")  # the target the draft records
    tok, target, head = loaded.tok, loaded.target, loaded.head
    draft_ids = head.to_target(torch.arange(len(head.d2t)))                       # [N] target id of each draft id
    engine = Engine(target, head, TreeConfig(args.num_steps, 1, args.num_steps + 1), 4096,
                    sample_draft=args.sample_draft)
    params = SamplingParams(args.temperature, max_new_tokens=args.max_new_tokens)
    g, turns = seeded_generator("cpu", args.seed), []

    def generate(ids, _):
        res = engine.generate(ids, params, {tok.eos_token_id}, g)
        turns.append((ids, res))
        return res.tokens

    answer_turns(tok, read_prompts(args.prompts, args.limit, parse_shard(args.shard)), generate)
    steps = accepted = 0
    top1 = sampled = 0.0
    with torch.no_grad():
        for prompt, res in turns:
            ids = torch.tensor([prompt + res.tokens])                                 # [1, L]
            logits, aux = target(ids, aux_layers=head.aux_layers)
            q_logp = unroll(head, target.embed_tokens, torch.cat(aux, -1), ids, 1)[0][0][0]   # [L, N]
            root = len(prompt)  # the first verify step's root: the token prefill emitted
            for a in res.accepted:
                if root >= ids.shape[1] - 1:  # the step a stop string or the length cut short
                    break
                p = target_probs(logits[0, root], params)                              # [V]
                q = (q_logp[root - 1].float() / args.temperature).softmax(-1)          # [N], drafts token root + 1
                top1 += float(p[draft_ids[q.argmax()]])
                sampled += float(torch.minimum(p[draft_ids], q).sum())
                accepted += a >= 1
                steps += 1
                root += a + 1
    report = {"draft": args.draft, "prompts": args.prompts, "shard": args.shard, "temperature": args.temperature,
              "sample_draft": args.sample_draft, "verify_steps": steps,
              "engine_first_acceptance": accepted / steps, "predicted_top1": top1 / steps,
              "predicted_sampled": sampled / steps}
    print(json.dumps(report, indent=2))
    if args.out:
        from toolkit.atomic import write_text

        write_text(Path(args.out), json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
