"""A chat reply written as a Responses API response: output items (a "reasoning" item for the thinking a reasoning
parser splits out, a "message" with one output_text part, a "function_call" per tool call) and, streamed, the
events OpenAI sends (response.created ... response.completed, each `event: TYPE` + `data: JSON` with a
sequence_number). The reply itself is chat's (reply.py): its deltas become the items' events, so the deltas of
a stream join to the whole response's items.
"""
from __future__ import annotations

import contextlib
import json
import time
import uuid

from fastapi import Request
from fastapi.responses import StreamingResponse

from toolkit.serve.reply import Reply, event_stream


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class Items:
    """Output items built from chat deltas, in order; feed() and close() return the stream events they make."""

    def __init__(self):
        self.items: list[dict] = []
        self.open: dict | None = None  # the last item, while more of it may come
        self.calls: dict[int, dict] = {}  # a chat tool call's index -> its function_call item

    def _add(self, item: dict, part: dict | None = None) -> list[dict]:
        events = self.close()
        self.items.append(item)
        self.open = item
        added = {**item, "content": []} if part is not None else dict(item)
        events.append({"type": "response.output_item.added", "output_index": len(self.items) - 1, "item": added})
        if part is not None:
            item["content"] = [part]
            events.append({"type": "response.content_part.added", "item_id": item["id"],
                           "output_index": len(self.items) - 1, "content_index": 0, "part": dict(part)})
        return events

    def _text(self, kind: str, piece: str) -> list[dict]:
        """Text added to the open reasoning or message item (a new one opened first if need be)."""
        item_kind, part_kind = ("reasoning", "reasoning_text") if kind == "reasoning" else ("message", "output_text")
        events = []
        if self.open is None or self.open["type"] != item_kind:
            item = ({"type": "reasoning", "id": _id("rs"), "summary": []} if kind == "reasoning" else
                    {"type": "message", "id": _id("msg"), "status": "in_progress", "role": "assistant"})
            part = {"type": part_kind, "text": ""} | ({} if kind == "reasoning" else {"annotations": []})
            events = self._add(item, part)
        self.open["content"][0]["text"] += piece
        return events + [{"type": f"response.{part_kind}.delta", "item_id": self.open["id"],
                          "output_index": len(self.items) - 1, "content_index": 0, "delta": piece}
                         | ({} if kind == "reasoning" else {"logprobs": []})]

    def feed(self, delta: dict) -> list[dict]:
        """A chat delta (or a whole chat message): reasoning_content, content, tool_calls."""
        events = []
        if delta.get("reasoning_content"):
            events += self._text("reasoning", delta["reasoning_content"])
        if delta.get("content"):
            events += self._text("message", delta["content"])
        for call in delta.get("tool_calls") or []:
            index = call.get("index", len(self.calls))  # a whole message's calls have none: each is a new one
            if call.get("id") is not None:  # a new call: its name, and the arguments so far
                item = {"type": "function_call", "id": _id("fc"), "call_id": call["id"],
                        "name": call["function"]["name"], "arguments": "", "status": "in_progress"}
                events += self._add(item)
                self.calls[index] = item
            item, piece = self.calls[index], call["function"].get("arguments") or ""
            if piece:
                item["arguments"] += piece
                events.append({"type": "response.function_call_arguments.delta", "item_id": item["id"],
                               "output_index": self.items.index(item), "delta": piece})
        return events

    def close(self, status: str = "completed") -> list[dict]:
        """The open item ends: a next one begins, or the reply is whole (status incomplete when cut at
        max_output_tokens)."""
        item, self.open = self.open, None
        if item is None:
            return []
        at, events = self.items.index(item), []
        if item["type"] == "function_call":
            events.append({"type": "response.function_call_arguments.done", "item_id": item["id"],
                           "output_index": at, "name": item["name"], "arguments": item["arguments"]})
        else:
            part = item["content"][0]
            events += [{"type": f"response.{part['type']}.done", "item_id": item["id"], "output_index": at,
                        "content_index": 0, "text": part["text"]} | ({"logprobs": []} if "annotations" in part else {}),
                       {"type": "response.content_part.done", "item_id": item["id"], "output_index": at,
                        "content_index": 0, "part": dict(part)}]
        if item["type"] != "reasoning":
            item["status"] = status
        return events + [{"type": "response.output_item.done", "output_index": at, "item": item}]

    def assistant_turn(self) -> dict:
        """The reply as the chat assistant message that continues it (previous_response_id)."""
        text = "".join(i["content"][0]["text"] for i in self.items if i["type"] == "message")
        calls = [{"id": i["call_id"], "type": "function", "function": {"name": i["name"], "arguments": i["arguments"]}}
                 for i in self.items if i["type"] == "function_call"]
        return {"role": "assistant", "content": text or None} | ({"tool_calls": calls} if calls else {})


def response_usage(usage: dict | None) -> dict | None:
    """Chat usage -> the Responses' names (the speculation figures kept beside them)."""
    if usage is None:
        return None
    return {"input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
                                     "cache_write_tokens": 0},
            "output_tokens": usage["completion_tokens"], "output_tokens_details": {
                "reasoning_tokens": usage.get("completion_tokens_details", {}).get("reasoning_tokens", 0)},
            "total_tokens": usage["total_tokens"], "speculative": usage["speculative"]}


class ResponseReply:
    """One Responses request answered through chat's Reply, whole or streamed; kept in `store` when it asks."""

    def __init__(self, reply: Reply, body, model: str, store, turns: list[dict], items: list[dict]):
        self.reply, self.body, self.model, self.store = reply, body, model, store
        self.turns = turns  # the chat turns before the reply (without the instructions), for store
        self.items = items  # the request's input as items (input_items lists them)
        self.rid, self.created = _id("resp"), int(time.time())

    def response(self, items: Items, status: str, usage: dict | None, error: dict | None = None) -> dict:
        b = self.body
        fmt = (b.text or {}).get("format") or {"type": "text"}
        cut = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {"id": self.rid, "object": "response", "created_at": self.created, "status": status,
                "error": error, "incomplete_details": cut,
                "instructions": b.instructions, "max_output_tokens": b.max_output_tokens, "model": self.model,
                "output": items.items, "parallel_tool_calls": b.parallel_tool_calls is not False,
                "previous_response_id": b.previous_response_id,
                "reasoning": {"effort": (b.reasoning or {}).get("effort"), "summary": None},
                "store": b.store, "temperature": b.temperature, "text": {"format": fmt},
                "tool_choice": b.tool_choice or "auto", "tools": b.tools or [], "top_p": b.top_p,
                "truncation": b.truncation or "disabled", "usage": response_usage(usage), "user": b.user,
                "metadata": b.metadata or {}}

    def _finish(self, items: Items, reason: str | None, usage: dict | None) -> tuple[dict, list[dict]]:
        status = "incomplete" if reason == "length" else "completed"
        events = items.close(status)
        response = self.response(items, status, usage)
        if self.body.store:
            self.store.put(response, self.turns + [items.assistant_turn()], self.items)
        return response, events

    async def whole(self, request: Request) -> dict:
        chat = await self.reply.whole(request)
        choice, items = chat["choices"][0], Items()
        items.feed(choice["message"])
        return self._finish(items, choice["finish_reason"], chat["usage"])[0]

    def streaming(self) -> StreamingResponse:
        return event_stream(self.events())

    async def events(self):
        items, count, reason, usage, error = Items(), 0, None, None, None

        def sse(event: dict) -> str:
            nonlocal count
            event["sequence_number"], count = count, count + 1
            return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"

        yield sse({"type": "response.created", "response": self.response(items, "in_progress", None)})
        yield sse({"type": "response.in_progress", "response": self.response(items, "in_progress", None)})
        async with contextlib.aclosing(self.reply.chunks()) as chunks:
            async for data in chunks:  # read to the end: an engine failure's error body is the last
                if "error" in data:
                    error = {"code": "server_error", "message": data["error"]["message"]}
                    continue
                for c in data["choices"]:
                    for event in items.feed(c["delta"]):
                        yield sse(event)
                    reason = c["finish_reason"] or reason
                usage = data.get("usage") or usage
        if error is not None:  # the engine failed: the response failed, and nothing is stored
            yield sse({"type": "response.failed", "response": self.response(items, "failed", None, error)})
            return
        response, events = self._finish(items, reason, usage)
        for event in events:
            yield sse(event)
        yield sse({"type": f"response.{'incomplete' if response['status'] == 'incomplete' else 'completed'}",
                   "response": response})
