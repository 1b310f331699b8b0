"""Chat messages as a request sends them: a role, text content (a string or text parts), and for tool use an
assistant turn's `tool_calls` (arguments as OpenAI sends them, JSON text) or a tool turn's `tool_call_id`. A bad
message is a pydantic validation error, which the API turns into a 400 naming the field (api_error.py).
"""
from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, field_validator, model_validator

ROLES = ("system", "developer", "user", "assistant", "tool")  # developer = OpenAI's newer name for system


def json_object(text: str) -> dict:
    """A call's arguments: JSON text of an object, or a ValueError saying what is wrong."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"the arguments are not JSON ({e.msg})") from None
    if not isinstance(value, dict):
        raise ValueError("the arguments must be a JSON object")
    return value


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    name: str
    arguments: str | dict  # OpenAI sends a JSON string

    def parsed(self) -> dict:
        return self.arguments if isinstance(self.arguments, dict) else json_object(self.arguments)

    @field_validator("arguments")
    @classmethod
    def arguments_object(cls, value):
        if isinstance(value, str):
            json_object(value)
        return value


class ToolCall(BaseModel):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    role: str
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant turn's calls (history)
    tool_call_id: str | None = None           # a tool turn: the call it answers
    name: str | None = None
    reasoning_content: str | None = None      # an assistant turn's reasoning (vLLM's newer name: reasoning), which
    reasoning: str | None = None              # the template keeps where it keeps past reasoning (tools.template_turn)

    @field_validator("role")
    @classmethod
    def known_role(cls, role: str) -> str:
        if role not in ROLES:
            raise ValueError(f"unsupported role {role!r}; accepted: {', '.join(ROLES)}")
        return role

    @model_validator(mode="after")
    def has_content(self):
        if self.content is None and self.role != "assistant":  # only an assistant turn may be empty (tool calls)
            raise ValueError(f"a {self.role} message needs content")
        if self.tool_calls and self.role != "assistant":
            raise ValueError(f"a {self.role} message has no tool_calls (an assistant turn makes the calls)")
        if (self.reasoning_content or self.reasoning) and self.role != "assistant":
            raise ValueError(f"a {self.role} message has no reasoning (an assistant turn's is its thinking)")
        return self

    def text(self) -> str:
        if isinstance(self.content, list):  # text parts on lines of their own, as vLLM joins them
            return "\n".join(part.text for part in self.content)
        return self.content or ""
