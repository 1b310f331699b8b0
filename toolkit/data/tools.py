"""Tool use in training conversations, read from OpenAI's chat schema (`tools`, an assistant turn's `tool_calls`,
role `tool`) and from ShareGPT's as LLaMA-Factory writes it (`from: function_call` whose value is the call as JSON
text, `from: observation` for its result, `tools` as JSON text), and normalized to what transformers' tool-use
chat templates read: tools as [{type: function, function: {name, ...}}], a call's arguments as a mapping (a JSON
string would come out quoted under `tojson`), as vLLM and `toolkit serve` hand them to the template."""
from __future__ import annotations

import json
from typing import Any

TOOL_ROLES = ("tool", "ipython", "function", "observation", "function_call")  # roles read here (schemas.ROLES)


def _bad(why: str):
    from toolkit.data.schemas import BadRecord

    return BadRecord(why)


def _json(value: Any, what: str) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as e:
        raise _bad(f"{what} is JSON text that does not parse ({e.msg})") from None


def tool_definitions(value: Any) -> list[dict]:
    """A record's `tools` (a list, or JSON text of one): each {type: function, function: {name, ...}} or the bare
    function {name, description?, parameters?}."""
    tools = _json(value, "tools")
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise _bad("tools should be a list of objects (OpenAI's {type: function, function: {name, parameters}})")
    out = []
    for t in tools:
        fn = t.get("function", t) if t.get("type", "function") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise _bad(f"a tool should be {{type: function, function: {{name, ...}}}} or {{name, ...}}, got keys "
                       f"{sorted(t)}")
        out.append({"type": "function", "function": fn})
    return _valid_text(out, "tools")


def _arguments(value: Any) -> dict:
    args = _json({} if value is None else value, "a tool call's arguments")
    if not isinstance(args, dict):
        raise _bad("a tool call's arguments should be a JSON object")
    return args


def tool_calls(value: Any) -> list[dict]:
    """An assistant turn's calls: [{id?, type?, function: {name, arguments}}] or bare [{name, arguments}] (one
    call alone too) -> [{type: function, function: {name, arguments: {...}}, id?}]."""
    calls = _json(value, "tool_calls")
    calls = [calls] if isinstance(calls, dict) else calls
    if not isinstance(calls, list) or not calls or not all(isinstance(c, dict) for c in calls):
        raise _bad("tool_calls should be a non-empty list of {function: {name, arguments}}")
    out = []
    for c in calls:
        fn = c.get("function", c)
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise _bad(f"a tool call should name its function: {{function: {{name, arguments}}}}, got keys "
                       f"{sorted(c)}")
        call = {"type": "function", "function": {"name": fn["name"],
                                                 "arguments": _arguments(fn.get("arguments", fn.get("parameters")))}}
        if isinstance(c.get("id"), str):
            call["id"] = c["id"]
        out.append(call)
    return _valid_text(out, "tool_calls")


def _valid_text(value, what: str):
    """value, refused when its strings hold an unpaired surrogate (a JSON escape no tokenizer encodes)."""
    from toolkit.data.schemas import surrogate

    if bad := surrogate(json.dumps(value, ensure_ascii=False)):
        raise _bad(f"{what} holds {bad}")
    return value


def tool_message(t: dict, role: str, mapped: str) -> dict:
    """A message of a tool conversation (t as read; role as written, mapped its schemas.ROLES name): an assistant
    turn with calls (its content may be empty), a ShareGPT function_call, or a tool turn answering a call."""
    content = t.get("content", t.get("value"))
    if role == "function_call":  # ShareGPT: the value is the call itself
        return {"role": "assistant", "content": "", "tool_calls": tool_calls(content)}
    if mapped == "tool":
        if not isinstance(content, str):  # a result given as JSON: the text a template shows
            content = json.dumps(content, ensure_ascii=False) if content is not None else ""
        from toolkit.data.schemas import surrogate

        if bad := surrogate(content):
            raise _bad(f"a tool result holds {bad}")
        msg = {"role": "tool", "content": content}
        for key in ("tool_call_id", "name"):
            if isinstance(t.get(key), str):
                msg[key] = t[key]
        return msg
    if mapped != "assistant":
        raise _bad(f"a {role} message has no tool_calls (an assistant turn makes the calls)")
    if content is not None and not isinstance(content, str):
        raise _bad(f"content should be a string, got {type(content).__name__}")
    return {"role": "assistant", "content": content or "", "tool_calls": tool_calls(t["tool_calls"])}


def split_tools(conv: list[dict]) -> tuple[list[dict], list[dict] | None]:
    """(conv without the tool definitions its first message carries, those definitions or None)."""
    from toolkit.data.schemas import TOOLS

    if not conv or TOOLS not in conv[0]:
        return conv, None
    first = {k: v for k, v in conv[0].items() if k != TOOLS}
    return [first, *conv[1:]], conv[0][TOOLS]
