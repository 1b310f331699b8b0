"""Evaluation on rows held back from training: the simulated tau (teacher-forced TTT accuracies) and the real
tau of our engine drafting a chain of `ttt_steps` tokens from each row's prompt, greedy. Both on the same
prompts, so the simulation can be checked against serving."""
from __future__ import annotations

import torch

from toolkit.infer.engine import Engine
from toolkit.infer.metrics import summarize
from toolkit.infer.sampling import SamplingParams
from toolkit.infer.tree import TreeConfig
from toolkit.train.losses import simulated_tau, ttt_loss
from toolkit.train.ttt import unroll


def prompt_of(row: dict) -> list[int]:
    """The tokens before the first assistant token: the prompt with the assistant header (generation prompt)."""
    first = int(row["loss_mask"].nonzero()[0])
    return row["input_ids"][:first].tolist()


@torch.no_grad()
def evaluate(head, target, rows: list[dict], steps: int, decay: float, max_new_tokens: int, stop_ids) -> dict:
    """head: a plain (unwrapped) Eagle3Head on the target's device; target: the full Transformer."""
    head.eval()
    t2d = torch.zeros(target.config.vocab_size, dtype=torch.bool, device=head.d2t.device)
    t2d[torch.arange(len(head.d2t), device=head.d2t.device) + head.d2t] = True
    accs, counts = [], []
    for r in rows:
        ids = r["input_ids"][None].to(target.embed_tokens.weight.device)
        logits, aux = target(ids, aux_layers=head.aux_layers)
        step_logits, _ = unroll(head, target.embed_tokens, torch.cat(aux, -1), ids, steps)
        _, _, acc, count = ttt_loss(step_logits, logits, r["loss_mask"][None].to(ids.device), t2d, decay)
        accs.append(acc * count)
        counts.append(count)
    n = len(min(accs, key=len)) if accs else 0
    acc = sum(a[:n] for a in accs) / torch.stack([c[:n] for c in counts]).sum(0).clamp_min(1) if n else None
    prompts = [prompt_of(r) for r in rows]
    max_len = max(len(p) for p in prompts) + max_new_tokens + 1
    engine = Engine(target, head, TreeConfig(steps, 1, steps + 1), max_len)
    results = [engine.generate(p, SamplingParams(0.0, max_new_tokens=max_new_tokens), stop_ids) for p in prompts]
    s = summarize(results, positions=steps)
    return {"eval_simulated_tau": simulated_tau(acc) if acc is not None else None,
            "eval_acc": [round(float(a), 4) for a in acc] if acc is not None else [],
            "eval_engine_tau": s["tau"], "eval_accept_rate_by_position": s["accept_rate_by_position"]}
