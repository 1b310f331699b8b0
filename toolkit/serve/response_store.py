"""The Responses API's routes (`POST /v1/responses`, `GET` / `DELETE /v1/responses/{id}`, `GET
/v1/responses/{id}/input_items`) and the responses kept for them: each stored response (store: true) with the chat
turns that continue it (previous_response_id) and its request's input as items (input_items lists them, as
OpenAI's `client.responses.input_items.list` pages them: newest first by default, `after` an item id, `limit`
1..100).
"""
from __future__ import annotations

import uuid
from collections import OrderedDict

from fastapi import Request
from pydantic import ValidationError

from toolkit.serve.api_error import ApiError, validation_error
from toolkit.serve.protocol import ChatRequest
from toolkit.serve.response_items import ResponseReply
from toolkit.serve.responses import ResponsesRequest, input_messages, renamed

PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def input_items(given: str | list[dict]) -> list[dict]:
    """A request's input (already read by input_messages) as the items input_items lists: each with an id and a
    status, message text as input_text parts (an assistant's as output_text)."""
    items = [{"role": "user", "content": given}] if isinstance(given, str) else given
    out = []
    for item in items:
        kind = item.get("type", "message")
        item = {**item, "type": kind, "id": item.get("id") or f"{PREFIX[kind]}_{uuid.uuid4().hex}"}
        if kind == "message":
            part = "output_text" if item["role"] == "assistant" else "input_text"
            content = item["content"]
            parts = [{"type": part, "text": content}] if isinstance(content, str) else [
                {**p, "type": part if p["type"] == "text" else p["type"]} for p in content]
            item["content"] = [p | {"annotations": []} if p["type"] == "output_text" else p for p in parts]
        if kind != "reasoning":
            item.setdefault("status", "completed")
        out.append(item)
    return out


class ResponseStore:
    """The last `capacity` stored responses (store: true), each with the chat turns that continue it and its
    input items."""

    def __init__(self, capacity: int = 1024):
        self.capacity, self.kept = capacity, OrderedDict()

    def put(self, response: dict, turns: list[dict], items: list[dict]) -> None:
        self.kept[response["id"]] = (response, turns, items)
        while len(self.kept) > self.capacity:
            self.kept.popitem(last=False)

    def get(self, rid: str, param: str | None = None) -> tuple[dict, list[dict], list[dict]]:
        if rid not in self.kept:
            raise ApiError(404, f"no stored response {rid!r} (stored: the last {self.capacity} with store: true)",
                           param, "not_found")
        return self.kept[rid]

    def delete(self, rid: str) -> None:
        self.get(rid)
        del self.kept[rid]

    def input_items(self, rid: str, after: str | None, limit: int, order: str) -> dict:
        """One page of a stored response's input items, as OpenAI's list object."""
        if order not in ("asc", "desc"):
            raise ApiError(400, f"order: give asc or desc, got {order!r}", "order")
        if not 1 <= limit <= 100:
            raise ApiError(400, f"limit: give 1..100, got {limit}", "limit")
        items = self.get(rid)[2][::1 if order == "asc" else -1]
        ids = [i["id"] for i in items]
        if after is not None and after not in ids:
            raise ApiError(400, f"after: no input item {after!r} in response {rid!r}", "after")
        start = 0 if after is None else ids.index(after) + 1
        page = items[start:start + limit]
        return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None, "has_more": start + limit < len(items)}


def add_responses_routes(app, parse, chat_sequences, queued, prompt_ids, model: str) -> None:
    """The Responses routes over build_app's chat steps (app.py): `chat_sequences` a chat request's engine
    sequences, `queued` them queued with their Reply, `prompt_ids` a chat request's prompt's token ids."""
    stored = ResponseStore()

    def as_chat(body: ResponsesRequest) -> tuple[ChatRequest, list[dict]]:
        """The chat request a Responses request amounts to, and the turns before its reply."""
        history = [] if body.previous_response_id is None else stored.get(
            body.previous_response_id, "previous_response_id")[1]
        turns = history + input_messages(body.input)  # what a response continuing this one sees before its reply
        try:  # a refusal names the Responses field (max_output_tokens, not max_tokens)
            return ChatRequest.model_validate(body.chat(turns)), turns
        except ValidationError as e:
            raise renamed(validation_error(e.errors())) from None
        except ApiError as e:
            raise renamed(e) from None

    @app.post("/v1/responses")
    async def responses(request: Request):
        body = await parse(request, ResponsesRequest)
        chat_body, turns = as_chat(body)
        try:
            seqs, text, tools, keep = await chat_sequences(chat_body)
        except ApiError as e:
            raise renamed(e) from None
        reply = ResponseReply(queued(chat_body, seqs, [text], True, tools, keep), body, model, stored, turns,
                              input_items(body.input))
        return reply.streaming() if body.stream else await reply.whole(request)

    @app.post("/v1/responses/input_tokens")
    async def input_tokens(request: Request):
        """OpenAI's count of the tokens a Responses request's input takes (instructions, tools and a previous
        response's turns included), as the prompt the reply would read."""
        return {"object": "response.input_tokens",
                "input_tokens": len(prompt_ids(as_chat(await parse(request, ResponsesRequest))[0]))}

    @app.get("/v1/responses/{rid}")
    async def stored_response(rid: str):
        return stored.get(rid)[0]

    @app.delete("/v1/responses/{rid}")
    async def delete_response(rid: str):
        stored.delete(rid)
        return {"id": rid, "object": "response.deleted", "deleted": True}

    @app.get("/v1/responses/{rid}/input_items")
    async def listed_input_items(rid: str, after: str | None = None, limit: str = "20", order: str = "desc"):
        if not limit.isdigit():
            raise ApiError(400, f"limit: give a count 1..100, got {limit!r}", "limit")
        return stored.input_items(rid, after, int(limit), order)
