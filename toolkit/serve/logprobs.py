"""Generated tokens' log-probabilities in the two shapes the OpenAI API gives them (vLLM's and SGLang's too).

Chat (`logprobs: true`, `top_logprobs: k`): {"content": [{"token", "logprob", "bytes", "top_logprobs": [k of
{"token", "logprob", "bytes"}]}]}. Completions (`logprobs: k`): {"tokens", "token_logprobs", "top_logprobs": [{token:
logprob} of the chosen token and the k likeliest], "text_offset"}. A token's text is its id decoded alone, special
tokens shown (a piece of a multi-byte character decodes to U+FFFD, as in vLLM); `bytes` are that text's UTF-8.
The figures are the engine's (toolkit/infer/logprobs.py): the target's raw log-softmax. Streamed, each chunk
carries the entries of the tokens that arrived since the last chunk, so a client that joins them gets every entry
once, in order; all of them add up to `usage.completion_tokens`.
"""
from __future__ import annotations

import math

from toolkit.infer.logprobs import TokenLogprob

MAX_LOGPROBS = 20  # the most alternatives a request may ask for per token (vLLM's --max-logprobs default)


def _finite(x: float) -> float:
    return max(x, -9999.0) if not math.isnan(x) else -9999.0  # JSON has no -inf; vLLM writes -9999.0 too


class LogprobWriter:
    """Turns TokenLogprob entries into a response's `logprobs` object, chunk by chunk (`text_offset` runs on)."""

    def __init__(self, tokenizer, chat: bool):
        self.tok, self.chat, self.offset, self.texts = tokenizer, chat, 0, {}

    def text(self, token: int) -> str:
        if token not in self.texts:
            self.texts[token] = self.tok.decode([token], skip_special_tokens=False)
        return self.texts[token]

    def __call__(self, entries: list[TokenLogprob]) -> dict:
        if self.chat:
            return {"content": [{**self._entry(e.token, e.logprob),
                                 "top_logprobs": [self._entry(t, lp) for t, lp in e.top]} for e in entries]}
        tokens = [self.text(e.token) for e in entries]
        offsets = []
        for t in tokens:
            offsets.append(self.offset)
            self.offset += len(t)
        return {"tokens": tokens, "token_logprobs": [_finite(e.logprob) for e in entries],
                "top_logprobs": [{self.text(t): _finite(lp) for t, lp in ((e.token, e.logprob), *e.top)}
                                 for e in entries],
                "text_offset": offsets}

    def _entry(self, token: int, logprob: float) -> dict:
        text = self.text(token)
        return {"token": text, "logprob": _finite(logprob), "bytes": list(text.encode("utf-8"))}
