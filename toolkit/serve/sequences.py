"""A request's choice as an engine sequence: the sampling values (the request's, else the served target's
defaults), its own seeded generator, the stop ids and strings, and its grammar mask, each checked against the
context and the vocabulary with a 400 naming the field.
"""
from __future__ import annotations

import torch

from toolkit.infer.grammar import GrammarMask, after_thinking
from toolkit.infer.sampling import SamplingParams
from toolkit.infer.sequence import Sequence
from toolkit.serve.api_error import ApiError
from toolkit.serve.text import ClientStops


class Sequences:
    def __init__(self, served, engine):
        self.served, self.engine, self.tok = served, engine, served.tok
        self.vocab = engine.target.config.vocab_size

    def __call__(self, body, ids: list[int], field: str, index: int = 0, compiled=None,
                 keep=frozenset()) -> Sequence:
        """Choice `index` of the request: its own generator (seed + index: n samples, each reproducible); `keep`:
        special ids its text shows (a tool-call parser's tags)."""
        served, ctx, tok = self.served, self.engine.max_len, self.tok
        if len(ids) >= ctx:
            raise ApiError(400, f"the prompt is {len(ids)} tokens; this server's context (--max-seq-len) is {ctx} "
                                "tokens, which leaves no room to generate", field, "context_length_exceeded")
        d = served.defaults
        max_tokens = body.max_tokens if body.max_tokens is not None else min(ctx - len(ids), d.max_tokens or ctx)
        max_tokens = max_tokens or 1  # 0 (with echo: the prompt scored alone): one token that Choice drops
        if len(ids) + max_tokens > ctx:  # named as the client sent it (chat: max_completion_tokens wins)
            name = "max_completion_tokens" if getattr(body, "max_completion_tokens", None) else "max_tokens"
            raise ApiError(400, f"{name} ({max_tokens}) + the prompt ({len(ids)} tokens) exceed this server's "
                                f"context of {ctx} tokens", name, "context_length_exceeded")
        if body.min_tokens > max_tokens:  # as vLLM refuses it
            raise ApiError(400, f"min_tokens ({body.min_tokens}) must not exceed the tokens to generate "
                                f"({max_tokens})", "min_tokens")
        params = SamplingParams(d.temperature if body.temperature is None else body.temperature,
                                d.top_p if body.top_p is None else body.top_p,
                                d.top_k if body.top_k is None else max(body.top_k, 0), max_tokens,
                                body.logprob_count(), d.min_p if body.min_p is None else body.min_p,
                                d.repetition_penalty if body.repetition_penalty is None else body.repetition_penalty,
                                body.presence_penalty, body.frequency_penalty, body.logit_bias,
                                body.min_tokens, body.prompt_logprob_count(), self.allowed_ids(body),
                                self.bad_words(body))
        gen = torch.Generator(device=self.engine.device)
        gen.manual_seed((body.seed + index) % 2 ** 64) if body.seed is not None else gen.seed()
        # the engine stops where the client's text shows a stop string, not generating past what the reply cuts
        stops = ClientStops(tok, body.stop, params.min_tokens, keep) if body.stop else None
        if any(t >= self.vocab for t, _ in body.logit_bias):
            raise ApiError(400, f"logit_bias: token ids must be in 0..{self.vocab - 1}", "logit_bias")
        extra = set(body.stop_token_ids or [])
        if any(not 0 <= t < self.vocab for t in extra):
            raise ApiError(400, f"stop_token_ids must be in 0..{self.vocab - 1}", "stop_token_ids")
        # ignore_eos (vLLM's): generate max_tokens whatever the model says, as load benchmarks ask
        stop_ids = (frozenset() if body.ignore_eos else served.stop_ids) | frozenset(extra)
        # min_tokens holds back the end-of-turn ids with ignore_eos too, as vLLM does
        # a grammar's own end is the model's end of turn (a request's stop_token_ids stay text it may need); beside
        # a reasoning parser it starts after the think block, as vLLM's (a chat reply thinks freely, then answers)
        after, active = after_thinking(tok, ids) if served.reasoning_parser and field == "messages" else (None, True)
        grammar = None if compiled is None else GrammarMask(compiled, served.stop_ids, self.vocab, after, active)
        return Sequence(ids, params, stop_ids, stops, gen, held_ids=served.stop_ids | frozenset(extra),
                        grammar=grammar)

    def allowed_ids(self, body) -> tuple:
        ids = tuple(sorted(set(body.allowed_token_ids or ())))
        if any(not 0 <= t < self.vocab for t in ids) or body.allowed_token_ids == []:
            raise ApiError(400, f"allowed_token_ids: give token ids in 0..{self.vocab - 1}", "allowed_token_ids")
        return ids

    def bad_words(self, body) -> tuple:
        """vLLM's reading: each word's ids as written (leading spaces stripped) and, where the tokenizer then gives
        other ids, with one leading space, as the word reads inside a sentence."""
        out = []
        for word in body.bad_words or ():
            if not word.strip():
                raise ApiError(400, "bad_words: give non-empty words", "bad_words")
            for text in (word.lstrip(), " " + word.lstrip()):
                ids = tuple(self.tok(text, add_special_tokens=False).input_ids)
                if ids and ids not in out:
                    out.append(ids)
        return tuple(out)
