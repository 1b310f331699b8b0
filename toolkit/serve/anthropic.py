"""Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`) read as the chat request it
amounts to, as vLLM's and SGLang's Anthropic endpoints serve it (so the anthropic client, and tools built on it,
can talk to a speculative server); errors in Anthropic's shape {"type": "error", "error": {"type", "message"}}.

A request becomes a ChatRequest (protocol.py) and is served as chat is, through the same template, constraint,
engine sequence and tool-call reading; anthropic_reply.py writes the reply as a Message and its stream events.

  system          a string or text blocks: a system turn first
  messages        user / assistant turns; content a string or blocks: text, an assistant's tool_use (chat's tool
                  calls), a user's tool_result (chat's tool turns, before the turn's text), thinking (the turn's
                  reasoning, kept where the template keeps past thinking; redacted_thinking dropped); a last
                  assistant turn is a prefill: the reply continues its text (chat's continue_final_message)
  max_tokens      required, as Anthropic has it (count_tokens needs none)
  stop_sequences, temperature, top_p, top_k, stream, metadata.user_id
  tools           custom tools {"name", "description", "input_schema"}: chat's function tools
  tool_choice     auto, any (chat's required), tool {"name"}, none; disable_parallel_tool_use: one call at most
  thinking        enabled / adaptive / disabled: the template's enable_thinking (Qwen3's); budget_tokens is not
                  enforced: the reply ends at max_tokens
  output_config   format {"type": "json_schema", "schema"}: chat's response_format

Server tools (web search, code execution, ...), MCP servers, containers, images, documents and output_config.effort
change the output and are not served: refused with a 400 naming them.
"""
from __future__ import annotations

import json
import re

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, StrictBool, StrictInt, ValidationError, model_validator

from toolkit.serve.api_error import ApiError, validation_error
from toolkit.serve.protocol import ChatRequest

# HTTP status -> Anthropic's error type (what its client raises on is the status; the type is for people)
KINDS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
         413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}
# chat fields -> the Messages fields they came from (a chat refusal names the Messages field)
PARAMS = {"stop": "stop_sequences", "response_format": "output_config.format", "user": "metadata.user_id",
          "parallel_tool_calls": "tool_choice.disable_parallel_tool_use"}
# chat's words in a refusal's text -> what a Messages client sends (its tools are {name, input_schema})
WORDS = [(r"tools\[(\d+)\]\.function\.parameters", r"tools.\1.input_schema"),
         (r"tools\[(\d+)\]\.function\.", r"tools.\1."),
         (r'tool_choice "none", "required" or a named function',
          'tool_choice {"type": "none"}, {"type": "any"} or {"type": "tool", "name": ...}')]


def messages_path(path: str) -> bool:
    """The Messages API's paths, whose every error (a 404, 405, 413, a bad query) is in Anthropic's shape."""
    return path == "/v1/messages" or path.startswith("/v1/messages/")


def error_body(status: int, message: str) -> dict:
    return {"type": "error", "error": {"type": KINDS.get(status, "api_error"), "message": message}}


def anthropic_error(err: ApiError) -> JSONResponse:
    """A refusal (raised as chat's ApiError) in Anthropic's shape, the Messages field named."""
    message = err.message
    for chat_name, name in PARAMS.items():
        if err.param and err.param.split(".")[0] == chat_name:
            message = message.replace(chat_name, name, 1)
    for chat_words, words in WORDS:
        message = re.sub(chat_words, words, message)
    return JSONResponse(error_body(err.status, message), status_code=err.status)


class MessagesRequest(BaseModel):
    model: str | None = None
    messages: list[dict]
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    system: str | list[dict] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: StrictInt | None = None
    stream: StrictBool = False
    tools: list[dict] | None = None
    tool_choice: dict | None = None
    thinking: dict | None = None
    output_config: dict | None = None
    metadata: dict | None = None
    container: str | dict | None = None
    mcp_servers: list | None = None

    @model_validator(mode="after")
    def served(self):
        for name in ("container", "mcp_servers"):
            if getattr(self, name):
                raise ApiError(400, f"{name}: not supported by this server; leave it out", name)
        if (self.output_config or {}).get("effort") is not None:
            raise ApiError(400, "output_config.effort: not supported; whether the served target thinks is up to its "
                                "chat template (thinking: enabled / disabled sets its enable_thinking)",
                           "output_config.effort")
        kind = (self.thinking or {}).get("type", "disabled")
        if kind not in ("enabled", "adaptive", "disabled"):
            raise ApiError(400, f"thinking.type: give enabled, adaptive or disabled, got {kind!r}", "thinking.type")
        return self

    def chat(self) -> dict:
        """The chat request body this request amounts to."""
        system = [] if self.system is None else [{"role": "system", "content": _text(self.system, "system")}]
        choice = self.tool_choice or {}
        body = {"model": self.model, "messages": system + chat_messages(self.messages),
                "max_tokens": self.max_tokens, "stop": self.stop_sequences, "temperature": self.temperature,
                "top_p": self.top_p, "top_k": self.top_k, "stream": self.stream,
                "user": (self.metadata or {}).get("user_id"), "tools": chat_tools(self.tools),
                "tool_choice": chat_tool_choice(self.tool_choice) if self.tools or self.tool_choice else None,
                "parallel_tool_calls": False if choice.get("disable_parallel_tool_use") else None,
                "response_format": chat_format((self.output_config or {}).get("format"))}
        if body["messages"][-1]["role"] == "assistant":  # a prefill: the reply goes on from its text, as Anthropic's
            body.update(continue_final_message=True, add_generation_prompt=False)
        if self.thinking is not None:
            body["chat_template_kwargs"] = {"enable_thinking": self.thinking.get("type") != "disabled"}
        if self.stream:  # the counts come with the last chunk, for message_delta
            body["stream_options"] = {"include_usage": True}
        return {k: v for k, v in body.items() if v is not None}


def _text(content, where: str) -> list[dict] | str:
    """A string, or text blocks as chat's text parts (their cache_control / citations dropped)."""
    if isinstance(content, str):
        return content
    parts = []
    for j, block in enumerate(content if isinstance(content, list) else [None]):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            kind = block.get("type") if isinstance(block, dict) else block
            raise ApiError(400, f"{where}.{j}: give text blocks here, got {kind!r}", where)
        parts.append({"type": "text", "text": block["text"]})
    return parts


def _result(block: dict, where: str) -> dict:
    """A tool_result block as chat's tool turn."""
    if not isinstance(block.get("tool_use_id"), str):
        raise ApiError(400, f"{where}: a tool_result block needs tool_use_id", where)
    content = block.get("content", "")
    text = content if isinstance(content, str) else "\n".join(p["text"] for p in _text(content, f"{where}.content"))
    if block.get("is_error"):
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": block["tool_use_id"], "content": text}


def chat_messages(messages: list[dict]) -> list[dict]:
    """Messages turns -> chat messages: a user turn's tool results become tool turns ahead of its text, an
    assistant turn's tool_use blocks its tool calls."""
    out: list[dict] = []
    for i, message in enumerate(messages):
        where, role = f"messages.{i}", message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant"):
            raise ApiError(400, f"{where}.role: give user or assistant (the system prompt goes in system), got "
                                f"{role!r}", f"{where}.role")
        content = message.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise ApiError(400, f"{where}.content: give a string or a list of content blocks", f"{where}.content")
        texts, calls, results, thought = [], [], [], []
        for j, block in enumerate(content):
            at, kind = f"{where}.content.{j}", block.get("type") if isinstance(block, dict) else None
            if kind == "text" and isinstance(block.get("text"), str):
                texts.append({"type": "text", "text": block["text"]})
            elif kind == "tool_use" and role == "assistant":
                if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str) or not isinstance(
                        block.get("input"), dict):
                    raise ApiError(400, f"{at}: a tool_use block needs id, name and input (an object)", at)
                calls.append({"id": block["id"], "type": "function",
                              "function": {"name": block["name"], "arguments": json.dumps(block["input"])}})
            elif kind == "tool_result" and role == "user":
                results.append(_result(block, at))
            elif kind == "thinking" and role == "assistant" and isinstance(block.get("thinking"), str):
                thought.append(block["thinking"])
            elif kind not in ("thinking", "redacted_thinking") or role != "assistant":
                raise ApiError(400, f"{at}: {role} content blocks of type {kind!r} are not served; accepted: text, "
                                    "tool_use (assistant), tool_result (user), thinking (assistant)", at)
        out += results
        if calls:
            out.append({"role": "assistant", "content": texts or None, "tool_calls": calls})
        elif texts or not results:
            out.append({"role": role, "content": texts})
        if thought and out and out[-1]["role"] == "assistant":
            out[-1]["reasoning_content"] = "\n".join(thought)
    if not out:
        raise ApiError(400, "messages: give at least one message", "messages")
    return out


def chat_tools(tools: list[dict] | None) -> list[dict] | None:
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") not in (None, "custom") or not isinstance(tool.get("name"), str):
            raise ApiError(400, f"tools.{i}: only custom tools {{name, description, input_schema}} are served, got "
                                f"type {tool.get('type')!r}", f"tools.{i}")
        function = {"name": tool["name"], "parameters": tool.get("input_schema") or {"type": "object"}}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def chat_tool_choice(choice: dict | None) -> str | dict:
    kind = (choice or {}).get("type", "auto")
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise ApiError(400, 'tool_choice: give {"type": "auto"}, {"type": "any"}, {"type": "none"} or '
                        '{"type": "tool", "name": ...}', "tool_choice")


def chat_format(fmt: dict | None) -> dict | None:
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise ApiError(400, 'output_config.format: give {"type": "json_schema", "schema": {...}}',
                       "output_config.format")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}


def as_chat(body: MessagesRequest) -> ChatRequest:
    try:
        return ChatRequest.model_validate(body.chat())
    except ValidationError as e:
        raise validation_error(e.errors()) from None


def add_messages_routes(app, parse, chat_sequences, queued, prompt_ids, model: str) -> None:
    """POST /v1/messages and /v1/messages/count_tokens over build_app's chat steps (app.py): `chat_sequences` a chat
    request's engine sequences, `queued` them queued with their Reply, `prompt_ids` its prompt's token ids."""
    from toolkit.serve.anthropic_reply import MessageReply

    @app.post("/v1/messages")
    async def messages(request: Request):
        try:
            body = await parse(request, MessagesRequest)
            if body.max_tokens is None:
                raise ApiError(400, "max_tokens: required (the most tokens the reply may have)", "max_tokens")
            chat = as_chat(body)
            seqs, text, tools, keep = await chat_sequences(chat)
            reply = MessageReply(queued(chat, seqs, [text], True, tools, keep), model, len(seqs[0].prompt))
            return reply.streaming() if body.stream else await reply.whole(request)
        except ApiError as err:
            return anthropic_error(err)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request):
        try:
            return {"input_tokens": len(prompt_ids(as_chat(await parse(request, MessagesRequest))))}
        except ApiError as err:
            return anthropic_error(err)
