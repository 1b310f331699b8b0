"""Log-probabilities of generated tokens, as OpenAI's `logprobs` / `top_logprobs` report them.

Each token's log-probability is taken from the target's raw distribution at the position it was chosen at: the
log-softmax of the logits, before temperature, top-k or top-p (vLLM's default, `--logprobs-mode raw_logprobs`).
A speculative step reads them from the verify forward's logits at the accepted path's nodes, the same logits
plain decoding computes at those positions, so they do not depend on the draft. A prompt's own tokens (vLLM's
`prompt_logprobs`, OpenAI's `echo` with `logprobs`) are read from the prefill's final hidden states, token i + 1
at position i; the first prompt token has none.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # the `top` most likely (id, log-prob) there, most likely first
    rank: int = 1                            # 1 + how many tokens were likelier there (vLLM's `rank`)


def token_logprobs(logits: torch.Tensor, tokens: list[int], top: int) -> list[TokenLogprob]:
    """logits [n, V]: the target's at the positions where tokens [n] were chosen -> one TokenLogprob each."""
    logp = torch.log_softmax(logits.float(), dim=-1)                                    # [n, V]
    index = torch.tensor(tokens, device=logp.device)[:, None]
    chosen = logp.gather(-1, index)                                                     # [n, 1]
    ranks = ((logp > chosen).sum(-1) + 1).tolist()                                      # [n]
    chosen = chosen[:, 0].tolist()
    if not top:
        return [TokenLogprob(t, lp, (), r) for t, lp, r in zip(tokens, chosen, ranks)]
    values, ids = logp.topk(min(top, logp.shape[-1]), dim=-1)                          # [n, top] each
    return [TokenLogprob(t, lp, tuple(zip(i, v)), r) for t, lp, i, v, r in zip(tokens, chosen, ids.tolist(),
                                                                              values.tolist(), ranks)]


def prompt_logprobs(readout, normed: torch.Tensor, prompt: list[int], top: int, chunk: int = 256
                    ) -> list[TokenLogprob]:
    """normed [L, H]: the target's final normed hidden states over a prompt of L tokens -> a TokenLogprob for each
    of prompt[1:]. Read out `chunk` positions at a time: a 4k-token prompt's logits over a 128k vocabulary would
    be 2 GB at once."""
    out: list[TokenLogprob] = []
    for start in range(0, len(prompt) - 1, chunk):
        stop = min(start + chunk, len(prompt) - 1)
        out += token_logprobs(readout(normed[start:stop]), prompt[start + 1:stop + 1], top)
    return out
