"""OpenAI's Responses API (`POST /v1/responses`) read as the chat request it amounts to (its routes and the responses
kept for `previous_response_id`, `GET` / `DELETE /v1/responses/{id}` and input_items: response_store.py).

A request becomes a ChatRequest (protocol.py) and is served as chat is, through the same template, constraint,
engine sequence and tool-call reading; response_items.py writes the reply as Responses output items and events.

  input           a string (one user turn) or items: messages ({"role", "content": text or input_text /
                  output_text parts}, "developer" as system), "function_call" and "function_call_output" items
                  (an assistant turn's tool calls and their results), "reasoning" items (the reasoning of the
                  assistant turn that follows them: the template keeps it where it keeps past thinking)
  instructions    a system turn first (not carried over to a response that continues this one, as OpenAI has it)
  tools           function tools in the Responses' flat form {"type": "function", "name", "parameters", ...}
  text.format     text, json_object or json_schema {"name", "schema", "strict"}: chat's response_format
  max_output_tokens, temperature, top_p, tool_choice, parallel_tool_calls, store, metadata, user; vLLM's top_k

Anything that would change the output and is not served (built-in tools, background, a conversation object,
prompt templates, images and files) is refused with a 400 naming the field. `reasoning.effort` is chat's
`reasoning_effort`: the template's variable (gpt-oss's reasoning level).
"""
from __future__ import annotations

import re

from pydantic import BaseModel, Field, StrictBool, StrictInt, model_validator

from toolkit.serve.api_error import ApiError
from toolkit.serve.messages import json_object

# Responses fields -> the chat fields they become (a chat refusal names the Responses field)
PARAMS = {"max_tokens": "max_output_tokens", "response_format": "text.format", "messages": "input",
          "reasoning_effort": "reasoning.effort"}


class ResponsesRequest(BaseModel):
    model: str | None = None
    input: str | list[dict]
    instructions: str | None = None
    max_output_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    top_k: StrictInt | None = None
    seed: StrictInt | None = None
    stream: StrictBool = False
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: StrictBool | None = None
    text: dict | None = None
    reasoning: dict | None = None
    store: StrictBool = True
    previous_response_id: str | None = None
    metadata: dict | None = None
    user: str | None = None
    include: list[str] | None = None  # extra output data (encrypted reasoning, logprobs): none kept here
    truncation: str | None = None     # "disabled" or "auto": a prompt over the context is refused either way
    background: StrictBool = False
    conversation: str | dict | None = None
    prompt: dict | None = None
    max_tool_calls: StrictInt | None = None
    top_logprobs: StrictInt | None = None

    @model_validator(mode="after")
    def served(self):
        for name in ("background", "conversation", "prompt", "max_tool_calls", "top_logprobs"):
            value = getattr(self, name)
            if value not in (None, False, 0):
                raise ApiError(400, f"{name} is not supported by this server; leave it out", name)
        if self.truncation not in (None, "disabled", "auto"):
            raise ApiError(400, f"truncation {self.truncation!r}: give disabled or auto", "truncation")
        return self

    def chat(self, turns: list[dict]) -> dict:
        """The chat request body this request amounts to, over `turns`: a stored response's turns
        (previous_response_id), then this input's (input_messages); the instructions go first."""
        system = [{"role": "system", "content": self.instructions}] if self.instructions is not None else []
        fmt = (self.text or {}).get("format")
        body = {"model": self.model, "messages": system + turns,
                "max_tokens": self.max_output_tokens, "temperature": self.temperature, "top_p": self.top_p,
                "top_k": self.top_k, "seed": self.seed, "stream": self.stream, "user": self.user,
                "tools": chat_tools(self.tools), "tool_choice": chat_tool_choice(self.tool_choice),
                "parallel_tool_calls": self.parallel_tool_calls, "response_format": chat_format(fmt),
                "reasoning_effort": (self.reasoning or {}).get("effort")}
        if self.stream:  # the counts come with the last chunk, for response.completed
            body["stream_options"] = {"include_usage": True}
        return {k: v for k, v in body.items() if v is not None}


def _text(content, where: str) -> str:
    """A message's content: a string, or text parts (input_text / output_text, chat's text) joined by lines."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"{where}.content: give a string or a list of input_text parts", f"{where}.content")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text") or not isinstance(part.get("text"), str):
            raise ApiError(400, f"{where}.content.{j}: only text parts (input_text, output_text) are served, got "
                                f"{kind!r}", f"{where}.content.{j}")
        texts.append(part["text"])
    return "\n".join(texts)


def input_messages(items: str | list[dict]) -> list[dict]:
    """Responses input -> chat messages; an assistant turn's function calls go on one assistant message."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict] = []
    thought = []  # reasoning items' text, for the assistant turn they come before

    def reasoned(message: dict) -> dict:
        if thought and message["role"] == "assistant":
            message["reasoning_content"] = "\n".join(thought)
            thought.clear()
        return message

    for i, item in enumerate(items):
        where = f"input.{i}"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise ApiError(400, f"{where}.role: give user, system, developer or assistant, got {role!r}",
                               f"{where}.role")
            messages.append(reasoned({"role": role, "content": _text(item.get("content"), where)}))
        elif kind == "function_call":
            if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
                raise ApiError(400, f"{where}: a function_call item needs call_id, name and arguments (JSON text)",
                               where)
            try:
                json_object(item["arguments"])
            except ValueError as e:
                raise ApiError(400, f"{where}.arguments: {e}", f"{where}.arguments") from None
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments")}}
            if not messages or messages[-1]["role"] != "assistant":
                messages.append({"role": "assistant", "content": None})
            reasoned(messages[-1]).setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(item.get("call_id"), str) or output is None:
                raise ApiError(400, f"{where}: a function_call_output item needs call_id and output", where)
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                             "content": output if isinstance(output, str) else _text(output, where)})
        elif kind == "reasoning":
            parts = item.get("content") or []
            if not isinstance(parts, list):
                raise ApiError(400, f"{where}.content: give a list of reasoning_text parts", f"{where}.content")
            thought += [p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)]
        else:
            raise ApiError(400, f"{where}: input items of type {kind!r} are not served; accepted: message, "
                                "function_call, function_call_output, reasoning", where)
    if not messages:
        raise ApiError(400, "input holds no message", "input")
    return messages


def chat_tools(tools: list[dict] | None) -> list[dict] | None:
    """Responses' flat function tools -> chat's nested ones; any other kind of tool is refused."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise ApiError(400, f"tools.{i}: only function tools are served, got type {tool.get('type')!r}",
                           f"tools.{i}")
        out.append({"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}})
    return out


def chat_tool_choice(choice: str | dict | None) -> str | dict | None:
    if not isinstance(choice, dict):
        return choice
    if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
        raise ApiError(400, 'tool_choice: give none, auto, required or {"type": "function", "name": ...}',
                       "tool_choice")
    return {"type": "function", "function": {"name": choice["name"]}}


def chat_format(fmt: dict | None) -> dict | None:
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise ApiError(400, "text.format: give an object {\"type\": text | json_object | json_schema, ...}",
                       "text.format")
    if fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}
    raise ApiError(400, f"text.format: give type text, json_object or json_schema, got {fmt.get('type')!r}",
                   "text.format")


def renamed(err: ApiError) -> ApiError:
    """A chat refusal of a translated request, naming the Responses field (its function tools are flat)."""
    flat = re.compile(r"tools\[(\d+)\]\.function\.")
    err.message, err.param = flat.sub(r"tools.\1.", err.message), err.param and flat.sub(r"tools.\1.", err.param)
    if err.param:
        head, dot, rest = err.param.partition(".")
        if head in PARAMS:
            err.param = PARAMS[head] + dot + rest
            err.message = err.message.replace(head, PARAMS[head], 1)
    return err

