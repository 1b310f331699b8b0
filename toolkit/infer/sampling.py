"""Sampling parameters and the target distribution they define (temperature, min-p, top-k, top-p; the penalties
are in penalties.py).

Speculative sampling is lossless only if draft verification uses exactly the distribution plain sampling
would use, so both go through `target_probs`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy, as is anything below GREEDY_BELOW
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 256
    logprobs: int | None = None  # None: none; k: each generated token's log-prob and the k likeliest (logprobs.py)
    min_p: float = 0.0               # drop tokens less likely than min_p x the likeliest one's probability
    repetition_penalty: float = 1.0  # penalties.py: 1 and 0 are off
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple = ()           # ((token id, bias), ...): added to the raw logits before the penalties
    min_tokens: int = 0              # stop ids masked and stop strings unchecked until this many tokens are out
    prompt_logprobs: int | None = None  # None: none; k: each prompt token's log-prob (the first's none) and k likeliest
    allowed_token_ids: tuple = ()    # vLLM's: only these may be generated (penalties.py); () = all
    bad_words: tuple = ()            # vLLM's: token-id sequences never completed in the output (penalties.py)

    def __post_init__(self):
        if not 0 <= self.temperature < float("inf"):  # NaN fails too; inf would sample uniformly
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be positive, got {self.max_new_tokens}")
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError(f"logprobs must be >= 0 (the likeliest tokens to list beside each one), got "
                             f"{self.logprobs}")
        if self.prompt_logprobs is not None and self.prompt_logprobs < 0:
            raise ValueError(f"prompt_logprobs must be >= 0 (the likeliest tokens to list beside each), got "
                             f"{self.prompt_logprobs}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1] (0 = off), got {self.min_p}")
        if not 0 < self.repetition_penalty < float("inf"):
            raise ValueError(f"repetition_penalty must be a finite number > 0 (1 = off), got {self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise ValueError(f"{name} must be in [-2, 2] (0 = off), got {getattr(self, name)}")
        if not 0 <= self.min_tokens <= self.max_new_tokens:
            raise ValueError(f"min_tokens must be in [0, max_new_tokens = {self.max_new_tokens}], got {self.min_tokens}")
        if any(not (isinstance(t, int) and t >= 0) for t in self.allowed_token_ids):
            raise ValueError(f"allowed_token_ids must be token ids >= 0, got {list(self.allowed_token_ids)}")
        if any(not w or not all(isinstance(t, int) and t >= 0 for t in w) for w in self.bad_words):
            raise ValueError(f"bad_words must be non-empty sequences of token ids >= 0, got {list(self.bad_words)}")
        for token, bias in self.logit_bias:
            if not (isinstance(token, int) and token >= 0 and -100 <= bias <= 100):
                raise ValueError(f"logit_bias takes (token id >= 0, bias in [-100, 100]) pairs, got ({token}, {bias})")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def penalized(self) -> bool:
        """Whether the raw logits are changed before sampling: a logit bias, a penalty or min_tokens (penalties.py)."""
        return (self.repetition_penalty != 1 or bool(self.presence_penalty) or bool(self.frequency_penalty)
                or bool(self.logit_bias) or self.min_tokens > 0 or bool(self.allowed_token_ids) or bool(self.bad_words))


# temperatures this small are greedy: logits / 1e-39 overflow to inf, inf - inf is NaN, and one such request
# would fail its whole batch (vLLM instead samples any 0 < T < 0.01 at 0.01; both are near-greedy there)
GREEDY_BELOW = 1e-5


def target_probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """float32 probabilities [..., V] after temperature, then min-p, top-k, top-p (vLLM's order; transformers
    applies min-p last, which keeps a different set under top-p). Penalties come before (penalties.py)."""
    logits = logits.float()
    if p.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    # a repetition penalty near 0 (accepted: any r > 0) divides a seen token's logit past float32's range; +inf
    # makes softmax NaN and torch.multinomial would fail the whole batch's step. 1e30 / the smallest sampled
    # temperature (GREEDY_BELOW) still fits; -inf (a masked token) stays
    logits = logits.clamp(max=1e30) / p.temperature
    if p.min_p > 0:  # p(x) >= min_p * p(top), in logits: logit >= top logit + log(min_p)
        top = logits.max(-1, keepdim=True).values
        logits = logits.masked_fill(logits < top + math.log(p.min_p), float("-inf"))
    if p.top_k and p.top_k < logits.shape[-1]:
        kth = logits.topk(p.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if p.top_p < 1:
        # stable: which of tied logits at the cut is kept must not depend on the batch a row is in (CUDA's
        # unstable sort may order ties by their row's neighbours), or plain and speculative sampling part ways
        sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) >= p.top_p  # keep the smallest prefix reaching top_p
        drop[..., 0] = False  # and always the likeliest: a top_p below float32's smallest (1e-46) read as 0
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits.softmax(-1)


def seeded_generator(device: torch.device | str, seed: int) -> torch.Generator:
    """A generator seeded with `seed` on `device` (the target's): torch.multinomial on a CUDA tensor refuses a
    CPU generator ("Expected a 'cuda' device type for generator")."""
    return torch.Generator(device=torch.device(device)).manual_seed(seed)
