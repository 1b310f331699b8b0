"""A chat request's tools, as OpenAI's API and vLLM take them: `tools` (function definitions the chat template
shows the model), `tool_choice` ("none", "auto", "required", or {"type": "function", "function": {"name"}}) and
`parallel_tool_calls`.

  none      the tools are in the prompt, the reply is read as text (vLLM's default too)
  auto      the model decides; its reply is read with the server's --tool-call-parser (tool_calls.py), which
            `toolkit serve --enable-auto-tool-choice --tool-call-parser hermes|llama3_json` names (vLLM's flags)
  required  the reply is constrained to a JSON array of calls to the given functions with arguments of their
            schemas (the engine's grammar mask, toolkit/infer/grammar.py), at least one, one without
            parallel_tool_calls; the tools' $defs / definitions go to the array's root, where their $refs point
  named     the reply is constrained to that function's arguments (its `parameters` schema)

Both constrained forms are JSON on one line with `, ` and `: ` between items (`{"city": "Paris"}`, as models write
calls): the free whitespace JSON allows lets a small model pad a call forever.

Tools the request sends with no tool_choice mean auto, as OpenAI reads them. History turns carry the calls as
OpenAI sends them (arguments a JSON string); the template gets them as transformers' tool-use templates expect,
arguments as a mapping.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from toolkit.data.schemas import template_reasoning
from toolkit.serve.api_error import ApiError

NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # OpenAI's rule for function names
DEFS = ("$defs", "definitions")  # where a JSON schema keeps the subschemas its "$ref"s name


@dataclass(frozen=True)
class ToolChoice:
    mode: str                 # none, auto, required, named
    name: str | None = None   # named: the function
    parallel: bool = True     # more than one call per reply

    def constraint(self, tools: list[dict]) -> tuple[str, dict] | None:
        """(grammar kind, JSON schema) the reply is held to, for required and named; None otherwise."""
        if self.mode not in ("required", "named"):
            return None
        params = {t["function"]["name"]: t["function"].get("parameters") or {"type": "object"} for t in tools}
        if self.mode == "named":
            return "json_schema", params[self.name]
        params, defs = lift_defs(params)
        call = [{"type": "object", "properties": {"name": {"type": "string", "enum": [name]}, "parameters": schema},
                 "required": ["name", "parameters"], "additionalProperties": False} for name, schema in params.items()]
        array = {"type": "array", "minItems": 1, "items": call[0] if len(call) == 1 else {"anyOf": call}, **defs}
        return "json_schema", ({**array, "maxItems": 1} if not self.parallel else array)


def lift_defs(params: dict[str, dict]) -> tuple[dict[str, dict], dict]:
    """required's schema nests each tool's parameters under the array's items, where a "$ref": "#/$defs/X" (what
    pydantic writes for nested models) no longer resolves: each tool's $defs / definitions come out of its schema and
    go to the root of the combined one, as vLLM lifts them. Two tools that define one name differently are
    refused. Returns (the schemas without them, {"$defs": {...}, "definitions": {...}} of those found)."""
    lifted, defs = {}, {}
    for i, (name, schema) in enumerate(params.items()):  # in the tools' order (their names are unique)
        found = {k: v for k, v in schema.items() if k in DEFS and isinstance(v, dict)}
        lifted[name] = {k: v for k, v in schema.items() if k not in found}
        for key, named in found.items():
            have = defs.setdefault(key, {})
            for d, sub in named.items():
                if d in have and have[d] != sub:
                    where = f"tools[{i}].function.parameters"
                    raise ApiError(400, f"{where}.{key}.{d}: {name!r} defines {d!r} differently from an earlier "
                                        f"tool; with tool_choice required the tools' {key} share one schema, so "
                                        "give each definition one name", where)
                have[d] = sub
    return lifted, defs


def check_tools(tools: list) -> list[dict]:
    """OpenAI function tools, each {"type": "function", "function": {"name", "description"?, "parameters"?}}."""
    seen = set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
            raise ApiError(400, f'{where}: give {{"type": "function", "function": {{"name": ..., "parameters": '
                                '{...}}} (function tools are the kind served)', where)
        name = fn.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            raise ApiError(400, f"{where}.function.name: give 1-64 letters, digits, _ or -; got {name!r}",
                           f"{where}.function.name")
        if name in seen:
            raise ApiError(400, f"{where}.function.name: {name!r} is defined twice", f"{where}.function.name")
        seen.add(name)
        if not isinstance(fn.get("parameters", {}) or {}, dict):
            raise ApiError(400, f"{where}.function.parameters: give a JSON schema object",
                           f"{where}.function.parameters")
        if not isinstance(fn.get("description", "") or "", str):
            raise ApiError(400, f"{where}.function.description: give a string", f"{where}.function.description")
    return tools


def read_choice(tools: list | None, choice, parallel: bool | None) -> ToolChoice:
    """The request's tool_choice, checked against its tools (vLLM's rules and messages)."""
    if choice is None:
        choice = "auto" if tools else "none"
    if isinstance(choice, dict):
        fn = choice.get("function")
        name = fn.get("name") if choice.get("type") == "function" and isinstance(fn, dict) else None
        if not isinstance(name, str):
            raise ApiError(400, 'tool_choice: give "none", "auto", "required" or {"type": "function", "function": '
                                '{"name": ...}}', "tool_choice")
        if not tools:
            raise ApiError(400, "tool_choice names a function, but the request sends no tools", "tool_choice")
        names = [t["function"]["name"] for t in tools]
        if name not in names:
            raise ApiError(400, f"tool_choice names {name!r}, which is not among the tools ({', '.join(names)})",
                           "tool_choice")
        return ToolChoice("named", name, parallel is not False)
    if choice not in ("none", "auto", "required"):
        raise ApiError(400, f'tool_choice {choice!r}: accepted "none", "auto", "required" or {{"type": "function", '
                            '"function": {"name": ...}}', "tool_choice")
    if choice == "required" and not tools:
        raise ApiError(400, 'tool_choice "required" needs tools', "tool_choice")
    return ToolChoice(choice if tools else "none", None, parallel is not False)


def template_turn(message) -> dict:
    """A request message as the chat template reads it: developer as system, a tool turn's call id and name, an
    assistant turn's calls with their arguments as a mapping (transformers' tool-use templates write them with
    `tojson`; a JSON string there would come out quoted), and its reasoning under the names templates read it by
    (Qwen3's reasoning_content, gpt-oss's thinking: each keeps it where the model wrote it and will read it, e.g.
    gpt-oss's analysis before a tool call with no answer after it yet)."""
    turn = {"role": "system" if message.role == "developer" else message.role, "content": message.text()}
    for key in ("tool_call_id", "name"):
        if getattr(message, key) is not None:
            turn[key] = getattr(message, key)
    turn = template_reasoning(turn, message.reasoning_content or message.reasoning)
    if message.tool_calls:
        turn["tool_calls"] = [{"id": c.id, "type": "function",
                               "function": {"name": c.function.name, "arguments": c.function.parsed()}}
                              for c in message.tool_calls]
    return turn

