"""A chat reply written as an Anthropic Messages API message: content blocks (a "thinking" block for the thinking a
reasoning parser splits out, "text", a "tool_use" per tool call) and, streamed, the events Anthropic sends
(message_start, ping, content_block_start / _delta / _stop per block, message_delta with the stop reason and
counts, message_stop; each `event: TYPE` + `data: JSON`). The reply itself is chat's (reply.py): its deltas become
the blocks' events, so a stream's deltas join to the whole message's blocks.
"""
from __future__ import annotations

import contextlib
import json
import uuid

from fastapi import Request

from toolkit.serve.reply import Reply, event_stream

# a chat delta's key -> the block it goes in, its empty form and its delta's type
TEXTS = {"reasoning_content": ("thinking", {"thinking": "", "signature": ""}, "thinking_delta"),
         "content": ("text", {"text": ""}, "text_delta")}


class Blocks:
    """Content blocks built from chat deltas, in order; feed() and close() return the stream events they make."""

    def __init__(self):
        self.blocks: list[dict] = []
        self.open: dict | None = None  # the last block, while more of it may come
        self.calls: dict[int, dict] = {}  # a chat tool call's index -> its tool_use block
        self.arguments: dict[str, str] = {}  # a tool_use block's id -> its input as JSON text so far

    def _start(self, block: dict) -> list[dict]:
        events = self.close()
        self.blocks.append(block)
        self.open = block
        return events + [{"type": "content_block_start", "index": len(self.blocks) - 1, "content_block": dict(block)}]

    def feed(self, delta: dict) -> list[dict]:
        """A chat delta (or a whole chat message): reasoning_content, content, tool_calls."""
        events = []
        for key, (kind, empty, delta_kind) in TEXTS.items():
            piece = delta.get(key)
            if not piece:
                continue
            if self.open is None or self.open["type"] != kind:
                events += self._start({"type": kind, **empty})
            self.open[kind] += piece
            events.append({"type": "content_block_delta", "index": len(self.blocks) - 1,
                           "delta": {"type": delta_kind, kind: piece}})
        for call in delta.get("tool_calls") or []:
            index = call.get("index", len(self.calls))  # a whole message's calls have none: each is a new one
            if call.get("id") is not None:  # a new call: its name, the input to come as JSON text
                block = {"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": {}}
                events += self._start(block)
                self.calls[index], self.arguments[block["id"]] = block, ""
            block, piece = self.calls[index], call["function"].get("arguments") or ""
            if piece:
                self.arguments[block["id"]] += piece
                events.append({"type": "content_block_delta", "index": self.blocks.index(block),
                               "delta": {"type": "input_json_delta", "partial_json": piece}})
        return events

    def close(self) -> list[dict]:
        """The open block ends: a next one begins, or the reply is whole."""
        block, self.open = self.open, None
        if block is None:
            return []
        if block["type"] == "tool_use":
            try:  # the tool parser hands on whole JSON objects; a call cut at max_tokens keeps {}
                block["input"] = json.loads(self.arguments[block["id"]] or "{}")
            except json.JSONDecodeError:
                pass
        return [{"type": "content_block_stop", "index": self.blocks.index(block)}]

    def called(self) -> bool:
        return any(b["type"] == "tool_use" for b in self.blocks)


def stop_reason(finish: str | None, matched, called: bool) -> tuple[str, str | None]:
    """Chat's finish_reason and vLLM's stop_reason (the stop string matched) -> Anthropic's stop_reason and
    stop_sequence."""
    if finish == "length":
        return "max_tokens", None
    if called:
        return "tool_use", None
    if isinstance(matched, str):
        return "stop_sequence", matched
    return "end_turn", None


def message_usage(prompt_tokens: int, usage: dict | None, cached: int = 0) -> dict:
    """Chat usage -> Anthropic's names, speculation figures beside: as Anthropic counts, input_tokens leaves out
    the prompt tokens read from the (prefix) cache, which cache_read_input_tokens counts; none written apart.
    Without chat usage yet (message_start), `cached` is the prefix cache's share."""
    cached = usage["prompt_tokens_details"]["cached_tokens"] if usage else cached
    out = {"input_tokens": prompt_tokens - cached, "output_tokens": usage["completion_tokens"] if usage else 0,
           "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}
    return out | ({"speculative": usage["speculative"]} if usage else {})


def _opening(data: dict) -> bool:
    """Chat's first chunk of a choice: the role alone, sent before the sequence is admitted."""
    return "error" not in data and all(c["delta"] == {"role": "assistant", "content": ""} and not c["finish_reason"]
                                       for c in data["choices"])


class MessageReply:
    """One Messages request answered through chat's Reply, whole or streamed."""

    def __init__(self, reply: Reply, model: str, prompt_tokens: int):
        self.reply, self.model, self.prompt_tokens = reply, model, prompt_tokens
        reply.beats = True  # the first update, shown or held by a parser, starts the stream
        self.mid = f"msg_{uuid.uuid4().hex}"

    def message(self, blocks: Blocks, stop: tuple, usage: dict | None, cached: int = 0) -> dict:
        return {"id": self.mid, "type": "message", "role": "assistant", "model": self.model,
                "content": blocks.blocks, "stop_reason": stop[0], "stop_sequence": stop[1],
                "usage": message_usage(self.prompt_tokens, usage, cached)}

    async def whole(self, request: Request) -> dict:
        chat = await self.reply.whole(request)
        choice, blocks = chat["choices"][0], Blocks()
        blocks.feed(choice["message"])
        blocks.close()
        stop = stop_reason(choice["finish_reason"], choice["stop_reason"], blocks.called())
        return self.message(blocks, stop, chat["usage"])

    def streaming(self):
        return event_stream(self.events())

    async def events(self):
        def sse(event: dict) -> str:
            return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"

        def from_start() -> str:
            cached = self.reply.choices[0].req.seq.result.cached_tokens
            return sse({"type": "message_start", "message": self.message(Blocks(), (None, None), None, cached)})

        blocks, finish, matched, usage, error, started = Blocks(), None, None, None, None, False
        async with contextlib.aclosing(self.reply.chunks()) as chunks:
            async for data in chunks:  # read to the end: an engine failure's error body is the last
                if not started and (data is None or not _opening(data)):  # an update: the sequence is admitted,
                    started = True                       # so the prefix cache's share of the prompt is known
                    yield from_start()
                    yield sse({"type": "ping"})
                if data is None:
                    continue
                if "error" in data:
                    error = data["error"]
                    continue
                for c in data["choices"]:
                    for event in blocks.feed(c["delta"]):
                        yield sse(event)
                    finish, matched = c["finish_reason"] or finish, c.get("stop_reason") or matched
                usage = data.get("usage") or usage
        if not started:
            yield from_start()
            yield sse({"type": "ping"})
        if error is not None:  # the engine failed, or the request's constraints left no token: the last event
            kind = "invalid_request_error" if error.get("type") == "invalid_request_error" else "api_error"
            yield sse({"type": "error", "error": {"type": kind, "message": error["message"]}})
            return
        for event in blocks.close():
            yield sse(event)
        reason, sequence = stop_reason(finish, matched, blocks.called())
        yield sse({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                   "usage": message_usage(self.prompt_tokens, usage)})
        yield sse({"type": "message_stop"})
