"""One choice of a response: the engine sequence behind it, its text so far (cut at a stop string), its
log-probs, and the counts `usage` reports. A request with `n` > 1 holds n choices, one engine sequence each (a
completions batch of p prompts, p x n: choice i * n + j is prompt i's j-th). With `echo` a completion choice's
first text (and log-probs) starts with its prompt's; with `echo` and `max_tokens: 0` it is the prompt alone (the
engine still generates one token, which no one sees: vLLM's way of scoring a prompt). A chat choice's text may be
read further: its thinking split out (reasoning.py) and its tool calls (tool_calls.py), whole or delta by delta.

Usage is read only once the engine is through with a sequence (its last update says so), never while the
engine thread may still add to it.
"""
from __future__ import annotations

import asyncio
from dataclasses import replace

from toolkit.infer.metrics import summarize
from toolkit.infer.sequence import Result
from toolkit.serve.api_error import ApiError
from toolkit.serve.batcher import Batcher, Request
from toolkit.serve.logprobs import LogprobWriter
from toolkit.serve.reasoning import reasoning_split, reasoning_tokens, reply_closed
from toolkit.serve.text import TextStream
from toolkit.serve.tool_calls import ToolCallReader

RELEASE_WAIT = 30.0  # seconds a reply cut at a stop string waits for the engine to let its sequence go


def through(result: Result, n: int) -> Result:
    """`result` as if generation had stopped at its n-th token, as the engine stops at a stop string: the verify
    steps that emitted tokens 2..n (the first comes from prefill), the last one's accepted count cut there."""
    accepted, emitted = [], min(len(result.tokens), 1)
    for a in result.accepted:
        if emitted >= n:
            break
        accepted.append(min(a, n - emitted - 1))
        emitted += accepted[-1] + 1
    return replace(result, tokens=result.tokens[:n], accepted=accepted, verify_steps=len(accepted),
                   checked=result.checked[:len(accepted)],
                   from_lookup=min(result.from_lookup, sum(accepted)))  # per step it is not kept: a bound


class Choice:
    def __init__(self, index: int, req: Request, batcher: Batcher, tok, stops: list[str], chat: bool,
                 echo: str | None = None, prompt_top: int | None = None, stop_token_ids=frozenset(),
                 silent: bool = False, reasoning: str | None = None, tools: tuple | None = None,
                 keep: frozenset = frozenset(), ids: bool = False, as_ids: bool = False):
        self.index, self.req, self.batcher, self.chat = index, req, batcher, chat
        self.stream = TextStream(tok, stops, req.seq.params.min_tokens, keep)  # keep: tool-call tags shown
        self.write = LogprobWriter(tok, chat, req.seq.params.logprobs, as_ids)
        self.echo = echo                # the prompt's text to put first (completions' echo), until it is sent
        self.prompt_top = prompt_top    # vLLM's prompt_logprobs: the likeliest tokens beside each prompt token
        self.stop_token_ids = stop_token_ids  # the request's own (not end-of-turn): vLLM's stop_reason names them
        self.silent = silent            # max_tokens 0: the generated token is dropped
        harmony_calls = bool(tools) and tools[0] == "openai"  # gpt-oss's calls are read by its reasoning split
        # harmony's reply says its channels itself: whether thinking is past matters to the think-tag parsers alone
        self.reasoning = reasoning
        self.closed = reasoning in ("qwen3", "deepseek_r1") and reply_closed(tok, req.seq)
        self.split = reasoning_split(reasoning, harmony_calls, self.closed) if reasoning else None
        self.calls = ToolCallReader(*tools) if tools else None  # chat: (mode, name, parallel) tool calls read
        self.called = False             # tool calls were read: finish_reason tool_calls (but for a named one)
        self.generated: list[int] = []  # the updates carry new tokens only
        self.logprobs: list = []        # their TokenLogprobs, when asked for
        self.given = 0                  # of those, the ones sent already
        self.done = False               # the engine is through with the sequence: its counts are final
        self.ids = ids                  # vLLM's return_token_ids: token_ids beside the text (prompt_token_ids once)
        self.ids_given = 0              # of the generated ids, the ones sent already
        self.prompt_ids_sent = False

    @property
    def finished(self) -> bool:
        return self.done or self.stream.stopped

    async def update(self, timeout: float | None = None) -> str:
        """Wait for the engine's next update of this sequence; the text it adds (nothing once finished)."""
        update = await asyncio.wait_for(self.req.updates.get(), timeout)
        if update.error is not None:
            if update.status < 500:
                raise ApiError(update.status, update.error, None, "no_token_allowed")
            if update.status == 503:  # the server stopped before the request was through
                raise ApiError(503, update.error, None, "server_shutting_down", "server_error")
            raise ApiError(500, update.error, None, "engine_error", "server_error")
        self.generated.extend(update.tokens)
        self.logprobs.extend(update.logprobs)
        self.done = update.done
        text = self.stream.update(self.generated, self.done)
        return "" if self.silent else text

    async def let_go(self) -> None:
        """The text showed a stop string before the engine stopped (ClientStops makes that rare): cancel the
        sequence and wait until the engine has let it go. Usage read at once raced the engine thread, which was
        still adding tokens and steps; read after, it is final and cut at the stop."""
        self.batcher.cancel(self.req, "stop")  # vLLM counts a stop its detokenizer finds as finished_reason stop
        try:
            while not self.done:
                await self.update(RELEASE_WAIT)
        except (ApiError, asyncio.TimeoutError):  # a failed step lets go too; a stuck engine must not hang us
            pass

    def finish_reason(self) -> str:
        # the engine says why it stopped (its stop strings are matched in text decoded with special tokens, the
        # stream's without: a stop string that is a special token ends it only there)
        if self.silent:
            return "length"
        return "stop" if self.stream.stopped or self.req.seq.result.finish == "stop" else "length"

    def sent_tokens(self) -> int:
        """The tokens the text so far stands for: through the one that completed a stop string, if one showed."""
        if self.silent:
            return 0
        return self.stream.stop_at if self.stream.stopped else len(self.generated)

    def stop_reason(self) -> int | str | None:
        """vLLM's `stop_reason`: the stop string or the request's stop token id that ended the choice; null for
        an end-of-turn token, the length, or while it runs."""
        if self.silent or not self.finished:
            return None
        if self.stream.stopped:
            return self.stream.matched
        tokens = self.req.seq.result.tokens
        return tokens[-1] if tokens and tokens[-1] in self.stop_token_ids else None

    def _new_logprobs(self) -> dict | None:
        """The log-probs not sent yet, through the token that completed a stop string if one showed; with echo
        still to send, the prompt's first."""
        seq = self.req.seq
        if seq.params.logprobs is None:
            return None
        end = 0 if self.silent else self.stream.stop_at if self.stream.stopped else len(self.logprobs)
        part, self.given = self.logprobs[self.given:end], max(self.given, end)
        if self.echo is None:
            return self.write(part)
        return self.write.echo(seq.prompt[0], seq.result.prompt_logprobs, part)

    def prompt_logprobs(self) -> list | None:
        """vLLM's `prompt_logprobs` of this choice's prompt, when the request asked for them."""
        top = self.prompt_top
        return None if top is None else self.write.vllm_prompt(self.req.seq.result.prompt_logprobs, top)

    def new_ids(self) -> dict:
        """return_token_ids: the generated ids not sent yet (through the one that completed a stop string), and
        a completion's prompt ids with its first."""
        if not self.ids:
            return {}
        end = self.sent_tokens()
        out = {"token_ids": self.generated[self.ids_given:end]}
        self.ids_given = max(self.ids_given, end)
        if not self.chat and not self.prompt_ids_sent:
            out["prompt_token_ids"], self.prompt_ids_sent = list(self.req.seq.prompt), True
        return out

    def unsent(self, chunk: dict) -> None:
        """A stream chunk that was not sent (a parser held its text back): its token_ids go with the next one."""
        self.ids_given -= len(chunk.get("token_ids", ()))

    def body(self, text: str | None, reason: str | None, delta: bool) -> dict:
        """The choice object: a whole message / text, or a stream chunk's delta."""
        lp = self._new_logprobs()
        if not self.chat:
            if self.echo is not None:  # sent once, ahead of the first text
                text, self.echo = self.echo + (text or ""), None
            out = {"index": self.index, "text": text or "", "logprobs": lp, "finish_reason": reason,
                   "stop_reason": reason and self.stop_reason(), **self.new_ids()}
            return out if delta else {**out, "prompt_logprobs": self.prompt_logprobs()}
        key = "delta" if delta else "message"
        if self.split is None and self.calls is None:
            msg = ({"content": text} if text is not None else {}) if delta else {"role": "assistant", "content": text}
        else:
            msg = self._read(text, delta, done=not delta or reason is not None)
            if reason == "stop" and self.called and self.calls.mode != "named":  # OpenAI's and vLLM's reason
                reason = "tool_calls"
        return {"index": self.index, key: msg, "logprobs": lp, "finish_reason": reason,
                "stop_reason": reason and self.stop_reason(), **self.new_ids()}

    def _read(self, text: str | None, delta: bool, done: bool) -> dict:
        """A chat message or delta with the thinking in reasoning_content (and vLLM's newer name, reasoning) and
        the tool calls in tool_calls, the rest in content."""
        thought, answer = self.split.feed(text or "", done) if self.split is not None else ("", text or "")
        calls = []
        if self.calls is not None:
            found = self.split.take_calls() if self.calls.mode == "openai" else ()
            answer, calls = self.calls.feed(answer, done, found)
            self.called |= bool(calls)
        if not delta:
            msg = {"role": "assistant", "content": answer or None}
            if self.split is not None:
                msg |= {"reasoning_content": thought or None, "reasoning": thought or None}
            whole = [{k: v for k, v in c.items() if k != "index"} for c in calls]  # index: a stream's merge key
            return msg | ({"tool_calls": whole} if calls else {})
        return {**({"reasoning_content": thought, "reasoning": thought} if thought else {}),
                **({"content": answer} if answer else {}), **({"tool_calls": calls} if calls else {})}

    def result(self) -> Result:
        """This choice's engine result, cut at the stop string its text was cut at (the engine may have gone on)."""
        result, upto = self.req.seq.result, 0 if self.silent else self.stream.stop_at
        return result if upto is None or upto >= len(result.tokens) else through(result, upto)


def usage(choices: list[Choice], positions: int = 0, n: int = 1) -> dict:
    """Token counts (each prompt once, the choices' tokens summed, as OpenAI counts n > 1 and vLLM a batch of
    prompts) and the speculation figures over all choices; `positions`: the draft tree's depth (0: none)."""
    results = [c.result() for c in choices]
    s = summarize(results, positions=positions)
    n_prompt, n_out = sum(len(c.req.seq.prompt) for c in choices[::n]), sum(len(r.tokens) for r in results)
    cached = sum(r.cached_tokens for r in results[::n])  # prompt positions the prefix cache held (OpenAI's name)
    thinking = {} if not choices[0].reasoning else {"completion_tokens_details": {"reasoning_tokens": sum(
        reasoning_tokens(c.stream.tok, c.reasoning, r.tokens, c.closed) for c, r in zip(choices, results))}}
    return {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out,
            "prompt_tokens_details": {"cached_tokens": cached}, **thinking,
            "speculative": {"verify_steps": s["verify_steps"], "accepted_tokens": sum(sum(r.accepted) for r in results),
                            # null, not 0, when no verify step ran (the answer ended at prefill's token)
                            "tau": s["tau"] if s["verify_steps"] else None,
                            "accept_rate_by_position": s["accept_rate_by_position"],
                            "accepted_length_histogram": s["accepted_length_histogram"],
                            "accepted_from_lookup": s["accepted_from_lookup"], "draft_tokens": s["draft_tokens"],
                            "draft_acceptance_rate": s["draft_acceptance_rate"]}}
