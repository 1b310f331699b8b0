"""Generated tokens' log-probabilities in the two shapes the OpenAI API gives them (vLLM's and SGLang's too).

Chat (`logprobs: true`, `top_logprobs: k`): {"content": [{"token", "logprob", "bytes", "top_logprobs": [k of
{"token", "logprob", "bytes"}]}]}. Completions (`logprobs: k`): {"tokens", "token_logprobs", "top_logprobs": [{token:
logprob} of the chosen token and the k likeliest], "text_offset"}. A token's text is its id decoded alone, special
tokens shown (a piece of a multi-byte character decodes to U+FFFD, as in vLLM); `bytes` are that text's UTF-8.
The figures are the engine's (toolkit/infer/logprobs.py): the target's raw log-softmax. Streamed, each chunk
carries the entries of the tokens that arrived since the last chunk, so a client that joins them gets every entry
once, in order; all of them add up to `usage.completion_tokens`.

A prompt's tokens come in two shapes: completions' `echo` with `logprobs: k` puts them before the completion's in
the same lists, the first prompt token's figures null (nothing comes before it); vLLM's `prompt_logprobs: k` gives
[null, {"token id": {"logprob", "rank", "decoded_token"}} of the prompt token and the k likeliest, ...].
"""
from __future__ import annotations

import math

from toolkit.infer.logprobs import TokenLogprob

MAX_LOGPROBS = 20  # the most alternatives a request may ask for per token (vLLM's --max-logprobs default)


def _finite(x: float) -> float:
    return max(x, -9999.0) if not math.isnan(x) else -9999.0  # JSON has no -inf; vLLM writes -9999.0 too


class LogprobWriter:
    """Turns TokenLogprob entries into a response's `logprobs` object, chunk by chunk (`text_offset` runs on)."""

    def __init__(self, tokenizer, chat: bool, top: int | None = None, as_ids: bool = False):
        self.tok, self.chat, self.offset, self.texts = tokenizer, chat, 0, {}
        self.top = top  # list at most this many alternatives (the engine may have listed more for another use)
        self.as_ids = as_ids  # vLLM's return_tokens_as_token_ids: "token_id:{id}", for tokens no text stands for

    def text(self, token: int) -> str:
        if token not in self.texts:
            self.texts[token] = f"token_id:{token}" if self.as_ids else self.tok.decode([token],
                                                                                        skip_special_tokens=False)
        return self.texts[token]

    def __call__(self, entries: list[TokenLogprob]) -> dict:
        entries = [e if self.top is None else TokenLogprob(e.token, e.logprob, e.top[:self.top], e.rank)
                   for e in entries]
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

    def echo(self, first: int, prompt: list[TokenLogprob], generated: list[TokenLogprob]) -> dict:
        """Completions' echo: the prompt's entries (its first token, `first`, with null figures), then the
        generated tokens' (their text offsets run on from the prompt's)."""
        offset, self.offset = self.offset, self.offset + len(self.text(first))
        head = self(prompt)
        rest = self(generated)
        return {"tokens": [self.text(first)] + head["tokens"] + rest["tokens"],
                "token_logprobs": [None] + head["token_logprobs"] + rest["token_logprobs"],
                "top_logprobs": [None] + head["top_logprobs"] + rest["top_logprobs"],
                "text_offset": [offset] + head["text_offset"] + rest["text_offset"]}

    def vllm_prompt(self, entries: list[TokenLogprob], top: int) -> list:
        """vLLM's `prompt_logprobs`: null for the first prompt token, then per token its own and the `top` likeliest."""
        return [None] + [{str(t): {"logprob": _finite(lp), "rank": rank, "decoded_token": self.text(t)}
                          for t, lp, rank in ((e.token, e.logprob, e.rank),
                                              *((t, lp, r) for r, (t, lp) in enumerate(e.top[:top], 1)))}
                         for e in entries]

    def _entry(self, token: int, logprob: float) -> dict:
        text = self.text(token)
        return {"token": text, "logprob": _finite(logprob), "bytes": list(text.encode("utf-8"))}
