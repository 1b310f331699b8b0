"""Evaluation on rows held back from training, all on the same tokens: the engine drafts a greedy chain of
`ttt_steps` tokens over each row's prompt (engine tau); the head is then unrolled as in training over the
prompt + the engine's answer, which gives the simulated tau (the formula of losses.py) and the replayed tau
(replay.py: the engine's accepted lengths recomputed from that one pass). Replayed == engine, step for step,
is the check that training and serving compute the same head; the simulated tau over-predicts both."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from toolkit.infer.engine import Engine
from toolkit.infer.metrics import summarize
from toolkit.infer.sampling import SamplingParams
from toolkit.infer.tree import TreeConfig
from toolkit.train.losses import simulated_tau, ttt_loss
from toolkit.train.replay import accept_lengths, replay_chain, replayed_tau
from toolkit.train.ttt import unroll


def prompt_of(row: dict) -> list[int]:
    """The tokens before the first assistant token: the prompt with the assistant header (generation prompt)."""
    first = int(row["loss_mask"].nonzero()[0])
    return row["input_ids"][:first].tolist()


@torch.no_grad()
def evaluate(head, target, rows: list[dict], steps: int, decay: float, max_new_tokens: int, stop_ids) -> dict:
    """head: a plain (unwrapped) Eagle3Head on the target's device; target: the full Transformer."""
    head.eval()
    device = target.embed_tokens.weight.device
    draft_ids = torch.arange(len(head.d2t), device=device) + head.d2t.to(device)  # target id of each draft id
    t2d = torch.zeros(target.config.vocab_size, dtype=torch.bool, device=device)
    t2d[draft_ids] = True
    prompts = [prompt_of(r) for r in rows]
    engine = Engine(target, head, TreeConfig(steps, 1, steps + 1), max(map(len, prompts)) + max_new_tokens + 1)
    results = [engine.generate(p, SamplingParams(0.0, max_new_tokens=max_new_tokens), stop_ids) for p in prompts]
    accs, counts, replayed, differing = [], [], [], 0
    for prompt, res in zip(prompts, results):
        ids = torch.tensor([prompt + res.tokens], device=device)                         # [1, L]
        mask = torch.tensor([[0] * len(prompt) + [1] * len(res.tokens)], device=device)
        logits, aux = target(ids, aux_layers=head.aux_layers)
        step_logits, _ = unroll(head, target.embed_tokens, torch.cat(aux, -1), ids, steps)
        _, _, acc, count = ttt_loss(step_logits, logits, mask, t2d, decay)
        accs.append(acc * count[1])  # over every assistant token
        counts.append(count[1])
        lengths = accept_lengths(step_logits, logits.argmax(-1), draft_ids)[0]
        replayed.append(replay_chain(lengths, len(prompt), len(res.tokens)))
        differing += replayed[-1] != res.accepted
    n = len(min(accs, key=len)) if accs else 0
    acc = sum(a[:n] for a in accs) / torch.stack([c[:n] for c in counts]).sum(0).clamp_min(1) if n else None
    s = summarize(results, positions=steps)
    return {"eval_simulated_tau": simulated_tau(acc) if acc is not None else None,
            "eval_acc": [round(float(a), 4) for a in acc] if acc is not None else [],
            "eval_replayed_tau": replayed_tau(replayed), "eval_replay_differing_rows": differing,
            "eval_engine_tau": s["tau"], "eval_accept_rate_by_position": s["accept_rate_by_position"]}


class HeldOutEval:
    """evaluate() at a training step, on the main process: the gathered weights go into the CPU template head,
    which runs in eval_dtype (what `toolkit bench` serves in by default) beside a target loaded once in that
    dtype (the training target's own when it already runs in it). Every rank calls it (ZeRO-3 gathers)."""

    def __init__(self, acc, template, held: list[dict], cfg, folder, stop_ids, eval_dtype, target=None):
        self.acc, self.template, self.held, self.cfg = acc, template, held, cfg
        self.folder, self.stop_ids, self.eval_dtype, self.target = folder, stop_ids, eval_dtype, target
        self.off = None  # why evaluation is off for this run: the target it would load does not fit
        if target is None and acc.is_main_process and cfg.eval_samples:  # offline: no target in training
            self.off = self._target_misfit()
            if self.off:
                print(f"warning: held-out evaluation is off for this run ({cfg.eval_samples} rows still held back; "
                      f"eval_samples=0 trains on them): {self.off}", file=sys.stderr, flush=True)

    def _target_misfit(self) -> str | None:
        """Why the target cannot be loaded for evaluation on this process's device (an offline run on cards
        smaller than it), found at the start: at the first evaluation it stopped the run, with the other ranks
        waiting for the main one until their timeout."""
        from toolkit.infer.config import ModelConfig
        from toolkit.infer.target_weights import check_weights_fit
        from toolkit.json_files import read_json

        folder = Path(self.folder)
        raw = read_json(folder / "config.json")
        try:
            check_weights_fit(folder, ModelConfig.from_folder(folder, raw), raw, self.eval_dtype, self.acc.device)
        except ValueError as e:
            return str(e)
        return None

    def __call__(self, model, step: int, tracker) -> None:
        from toolkit.infer.loading import load_target
        from toolkit.train.checkpoint import load_head

        state = self.acc.get_state_dict(model)  # collective under ZeRO-3
        if self.acc.is_main_process and self.cfg.eval_samples and self.off is None:
            load_head(self.template, state)
            if self.target is None:
                self.target = load_target(self.folder, self.eval_dtype, self.acc.device)
            res = evaluate(self.template.to(self.acc.device, self.eval_dtype), self.target, self.held,
                           self.cfg.ttt_steps, self.cfg.loss_decay, self.cfg.eval_max_new_tokens, self.stop_ids)
            self.template.to("cpu", torch.float32)
            tracker.log(step, res)
        self.acc.wait_for_everyone()
