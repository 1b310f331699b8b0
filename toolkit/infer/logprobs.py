"""Log-probabilities of generated tokens, as OpenAI's `logprobs` / `top_logprobs` report them.

Each token's log-probability is taken from the target's raw distribution at the position it was chosen at: the
log-softmax of the logits, before temperature, top-k or top-p (vLLM's default, `--logprobs-mode raw_logprobs`).
A speculative step reads them from the verify forward's logits at the accepted path's nodes, the same logits
plain decoding computes at those positions, so they do not depend on the draft.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # the `top` most likely (id, log-prob) there, most likely first


def token_logprobs(logits: torch.Tensor, tokens: list[int], top: int) -> list[TokenLogprob]:
    """logits [n, V]: the target's at the positions where tokens [n] were chosen -> one TokenLogprob each."""
    logp = torch.log_softmax(logits.float(), dim=-1)                                    # [n, V]
    index = torch.tensor(tokens, device=logp.device)[:, None]
    chosen = logp.gather(-1, index)[:, 0].tolist()                                      # [n]
    if not top:
        return [TokenLogprob(t, lp) for t, lp in zip(tokens, chosen)]
    values, ids = logp.topk(min(top, logp.shape[-1]), dim=-1)                          # [n, top] each
    return [TokenLogprob(t, lp, tuple(zip(i, v))) for t, lp, i, v in zip(tokens, chosen, ids.tolist(),
                                                                           values.tolist())]
