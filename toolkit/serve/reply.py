"""A request's choices answered: as one JSON body once every choice is through, or as server-sent events the way
OpenAI streams them (each chunk one choice's delta, the choices' chunks interleaved, `data: [DONE]` last).

Either way the text comes from the same incremental updates, so a stop string ends a whole reply where it ends a
stream. A client that goes away (a non-streamed one is checked once a second) frees every choice's row; an engine
failure on one choice ends the others too.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid

from fastapi import Request
from fastapi.responses import StreamingResponse

from toolkit.serve.api_error import ApiError
from toolkit.serve.batcher import Batcher
from toolkit.serve.choice import Choice, usage


def event_stream(events) -> StreamingResponse:
    """Server-sent events, unbuffered by the server and by proxies in front of it."""
    return StreamingResponse(events, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


class ClientGone(Exception):
    """A non-streamed request's client went away: its choices are cancelled, and the app answers 499 (nginx's
    "client closed request") to no one, so that /metrics counts it under that code and no error is logged."""


class Reply:
    def __init__(self, choices: list[Choice], body, chat: bool, model: str, batcher: Batcher, positions: int):
        self.choices, self.body, self.chat, self.model, self.batcher = choices, body, chat, model, batcher
        self.positions = positions  # draft positions usage reports
        self.rid, self.now = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", int(time.time())
        self.kind = "chat.completion" if chat else "text_completion"
        self.beats = False  # chunks() yields None for an update with nothing to show (the Messages stream's start)

    def cancel(self) -> None:
        """Free every choice's row (an engine failure: the others go too)."""
        for c in self.choices:
            self.batcher.cancel(c.req)

    def client_gone(self) -> None:
        self.cancel()
        self.batcher.metrics.cancelled.inc()

    def usage(self) -> dict:
        return usage(self.choices, self.positions, self.body.n)

    async def whole(self, request: Request) -> dict:
        async def collect(c: Choice) -> str:
            parts, checked = [], time.monotonic()
            while not c.finished:
                try:
                    parts.append(await c.update(timeout=1.0))
                except asyncio.TimeoutError:
                    pass
                # once a second whether tokens flow or not: every engine step posts an update, so a check
                # made only when none came for a second never ran while a left request kept generating
                if not c.done and time.monotonic() - checked >= 1.0:
                    checked = time.monotonic()
                    if await request.is_disconnected():
                        raise ClientGone
            if not c.done:
                await c.let_go()
            return "".join(parts)

        try:
            async with asyncio.TaskGroup() as group:  # one failing (or the client leaving) stops the others
                tasks = [group.create_task(collect(c)) for c in self.choices]
        except asyncio.CancelledError:  # the server stops
            self.client_gone()
            raise
        except BaseExceptionGroup as errors:
            if errors.subgroup(ClientGone) is not None:
                self.client_gone()
                raise ClientGone from None
            self.cancel()  # the engine failed a choice: the others' rows go too
            failed = errors.subgroup(ApiError)
            raise failed.exceptions[0] if failed is not None else errors from None
        return {"id": self.rid, "object": self.kind, "created": self.now, "model": self.model,
                "choices": [c.body(t.result(), c.finish_reason(), False) for c, t in zip(self.choices, tasks)],
                "usage": self.usage()}

    def streaming(self) -> StreamingResponse:
        return event_stream(self.events())

    def chunk(self, chunk_choices: list, **extra) -> dict:
        return {"id": self.rid, "object": f"{self.kind}.chunk" if self.chat else self.kind, "created": self.now,
                "model": self.model, "choices": chunk_choices, **extra}

    def counts(self, c: Choice) -> dict:
        """The usage key a chunk of choice c carries: none without include_usage, null with it (OpenAI: only the
        last chunk has the counts), c's counts so far with vLLM's continuous_usage_stats."""
        options = self.body.stream_options
        if not (options and options.include_usage):
            return {}
        if not options.continuous_usage_stats:
            return {"usage": None}
        prompt, out = len(c.req.seq.prompt), c.sent_tokens()
        return {"usage": {"prompt_tokens": prompt, "completion_tokens": out, "total_tokens": prompt + out}}

    async def events(self):
        """The chunks as server-sent events, `data: [DONE]` last (after an engine failure's error too)."""
        async with contextlib.aclosing(self.chunks()) as chunks:
            async for data in chunks:
                yield f"data: {json.dumps(data)}\n\n"
        yield "data: [DONE]\n\n"

    async def chunks(self):
        """The stream's chunk objects in order, the usage chunk last when asked for; an engine failure ends it with
        its error body. Closed early (the client went away), it frees every choice's row."""
        ended = failed = False
        waiting: dict = {}  # each unfinished choice's next update, as a task; the choices' chunks interleave
        try:
            if self.chat:
                for c in self.choices:  # vLLM's return_token_ids: the prompt's ids in the first chunk alone
                    ids = {"prompt_token_ids": list(c.req.seq.prompt)} if self.body.return_token_ids and not c.index \
                        else {}
                    yield self.chunk([{"index": c.index, "delta": {"role": "assistant", "content": ""},
                                       "logprobs": None, "finish_reason": None}], **self.counts(c), **ids)
            waiting = {asyncio.ensure_future(c.update()): c for c in self.choices}
            while waiting and not failed:
                ready, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                for task in ready:
                    c = waiting.pop(task)
                    try:
                        delta = task.result()
                    except ApiError as err:  # the engine failed: say so, then end the stream
                        yield err.body()
                        failed = True
                        break
                    chunk = c.body(delta, None, True) if delta else None
                    # a delta whose text a parser holds back (a tag's start, a tool call not closed) goes later
                    if chunk is not None and (not self.chat or chunk["delta"] or chunk["logprobs"] is not None):
                        yield self.chunk([chunk], **self.counts(c))
                    else:
                        if chunk is not None:  # its token ids (vLLM's return_token_ids) go with the next chunk
                            c.unsent(chunk)
                        if self.beats:  # an update with nothing to show yet: the sequence runs (admitted)
                            yield None
                    if not c.finished:
                        waiting[asyncio.ensure_future(c.update())] = c
                        continue
                    if not c.done:  # the update's word, not seq.done: that turns true before the step ends
                        await c.let_go()
                    yield self.chunk([c.body(None, c.finish_reason(), True)], **self.counts(c))
            if not failed and self.body.stream_options and self.body.stream_options.include_usage:
                yield self.chunk([], usage=self.usage())
            ended = True
        finally:
            for task in waiting:
                task.cancel()
            if not ended:  # the client went away mid-stream: free its rows
                self.client_gone()
            elif failed:  # the engine failed a choice: the others' rows go too
                self.cancel()
