"""One request inside the engine (Sequence), what it produced (Result), and stop strings."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from toolkit.infer.grammar import GrammarMask
from toolkit.infer.penalties import Penalties
from toolkit.infer.sampling import SamplingParams


@dataclass
class Result:
    tokens: list[int]                   # generated ids (prompt excluded), stops included
    verify_steps: int = 0               # target forwards after prefill
    accepted: list[int] = field(default_factory=list)  # draft tokens accepted per verify step
    seconds: dict = field(default_factory=lambda: {"prefill": 0.0, "draft": 0.0, "verify": 0.0})
    category: str = "all"               # the caller's label (bench groups τ by it)
    turn: int = 1                       # which turn of a multi-turn prompt (bench groups τ by it too)
    from_lookup: int = 0                # accepted draft tokens on nodes only the lookup branch proposed
    finish: str | None = None           # why it ended: "stop" (a stop id or string), "length" (max_new_tokens)
                                        # or "abort" (its constraints allowed no next token: `error` says so)
    error: str | None = None
    logprobs: list = field(default_factory=list)  # a TokenLogprob per token, when params.logprobs asks for them
    prompt_logprobs: list = field(default_factory=list)  # one per prompt token after the first, when asked for
    cached_tokens: int = 0              # prompt positions copied from the prefix cache, not prefilled
    checked: list[int] = field(default_factory=list)  # draft tokens (tree nodes after the root) per verify step

    @property
    def tau(self) -> float:
        """Tokens per verify step, the bonus token included (accepted + 1)."""
        return (sum(self.accepted) + len(self.accepted)) / max(len(self.accepted), 1)


class StopStrings:
    """True once the decoded generation contains one of `strings` (checked on a tail of tokens, so the cost
    per token stays constant). Generation stops at the token that completes the string, as plain decoding
    does; callers cut the text at the string."""

    def __init__(self, tokenizer, strings: list[str]):
        if not strings or any(not s for s in strings):
            raise ValueError("stop strings must be non-empty")
        self.tok, self.strings = tokenizer, list(strings)
        # tokens: each decodes to at least one byte (byte-level BPE spends 2-4 tokens on some characters)
        self.tail = max(len(s.encode("utf-8")) for s in strings) + 8

    def __call__(self, tokens: list[int], min_tokens: int = 0) -> bool:
        """Called after every new token. With min_tokens m (vLLM's rule), a stop string must end in the text of a
        token after the m-th: none in the first m tokens, none that they completed, found once past them."""
        if len(tokens) <= min_tokens:
            return False
        tail = tokens[-self.tail:]
        text = self.tok.decode(tail)
        if len(tokens) - len(tail) >= min_tokens:  # every token in the tail was checked: any string found is new
            return any(s in text for s in self.strings)
        new = len(os.path.commonprefix([self.tok.decode(tail[:-1]), text]))  # text[new:] came with the newest
        return any(text.find(s, max(new - len(s) + 1, 0)) >= 0 for s in self.strings)


@dataclass(eq=False)
class Sequence:
    """One request inside the engine: what to generate and how far it has got."""
    prompt: list[int]
    params: SamplingParams
    stop_ids: frozenset = frozenset()
    stop_strings: StopStrings | None = None
    generator: torch.Generator | None = None  # per request: a seed makes its sampling reproducible
    result: Result = field(default_factory=lambda: Result([]))
    done: bool = False
    prefix: int = 0                            # tokens in the KV cache; the root (last token) is not yet
    drafted: int = 0                           # positions with the draft's pairs in its cache (prefix_cache.py)
    root_out: torch.Tensor | None = None       # the draft's output and log-probs after the root
    root_logp: torch.Tensor | None = None
    penalties: Penalties | None = None         # its logit bias and token counts, when params ask for them
    held_ids: frozenset | None = None          # what min_tokens holds back (None: stop_ids); vLLM holds back the
                                               # end-of-turn ids even where ignore_eos leaves them out of stop_ids
    grammar: GrammarMask | None = None         # structured output: what the text must stay inside (grammar.py)

    def add(self, token: int) -> bool:
        """Append a generated token; True (and done) when generation stops here."""
        toks = self.result.tokens
        toks.append(token)
        if self.penalties is not None:
            self.penalties.add(token)
        if self.grammar is not None:
            self.grammar.add(token)
        strings = self.stop_strings is not None and self.stop_strings(toks, self.params.min_tokens)
        if token in self.stop_ids or strings:
            self.result.finish = "stop"  # a stop at the last allowed token is a stop, as in vLLM
        elif len(toks) >= self.params.max_new_tokens:
            self.result.finish = "length"
        self.done = self.result.finish is not None
        return self.done

    def stuck(self) -> None:
        """Its constraints leave no token to generate next (a grammar and allowed_token_ids with none in common, a
        bad word banning the last allowed id, min_tokens holding back the only ones allowed): it ends here."""
        p = self.params
        named = [name for name, on in (("structured output", self.grammar is not None),
                                       ("allowed_token_ids", bool(p.allowed_token_ids)),
                                       ("bad_words", bool(p.bad_words)),
                                       ("min_tokens", len(self.result.tokens) < p.min_tokens)) if on]
        self.result.finish, self.done = "abort", True
        named = " and ".join([", ".join(named[:-1]), named[-1]] if len(named) > 1 else named) or "constraints"
        self.result.error = (f"no token may follow output token {len(self.result.tokens)}: together, the request's "
                             f"{named} allow none (loosen them)")


def check_request(prompt: list[int], params: SamplingParams, vocab: int, max_len: int) -> None:
    """Refuse what cannot fit: an empty prompt, an id outside the vocabulary (the prompt's or a logit bias's),
    or prompt + max_new_tokens beyond the cache."""
    if not prompt:
        raise ValueError("a prompt is empty")
    # checked before admission, not left to the embedding: it would fail mid-admit, on CUDA as a device-side assert
    # that takes every running request (and the process's CUDA context) down with it
    low, high = min(prompt), max(prompt)
    if low < 0 or high >= vocab:
        raise ValueError(f"prompt token id {low if low < 0 else high} outside the vocabulary 0..{vocab - 1}")
    for name, ids in (("logit_bias", [t for t, _ in params.logit_bias]),
                      ("allowed_token_ids", params.allowed_token_ids),
                      ("bad_words", [t for w in params.bad_words for t in w])):
        outside = [t for t in ids if t >= vocab]
        if outside:
            raise ValueError(f"{name} names token id {outside[0]}, outside the vocabulary 0..{vocab - 1}")
    if len(prompt) + params.max_new_tokens > max_len:
        raise ValueError(f"prompt ({len(prompt)} tokens) + max_new_tokens ({params.max_new_tokens}) exceeds "
                         f"the engine's max length {max_len}")
