"""How models write the tool calls that end a reply, each format a parse from the finished text (from the marker
that opens the calls to the end) to (name, arguments as JSON text) pairs, or None when it is not calls of that
form. `toolkit/serve/tool_calls.py` streams the content before the marker and reads the rest with these; hermes'
`<tool_call>` blocks, which may sit between content, it reads itself.

  llama3_json  Llama 3.1 / 3.2: the reply opens with `<|python_tag|>` or `{`; `{"name", "parameters"}` objects
               separated by `;`
  pythonic     Llama 3.2 / 4, ToolACE: the reply opens with `[` (or Llama 4's `<|python_start|>`); a Python list
               of calls with keyword arguments of literal values, `[get_weather(city="Paris", days=2)]`
  mistral      Mistral / Mixtral: `[TOOL_CALLS]` then a JSON array of `{"name", "arguments"}` (v3 tokenizers) or
               `name[ARGS]{...}` per call, each after its own `[TOOL_CALLS]` (v11+); content may come first
"""
from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from typing import Callable

PYTHON_TAG, PYTHON_START, PYTHON_END = "<|python_tag|>", "<|python_start|>", "<|python_end|>"
TOOL_CALLS, ARGS = "[TOOL_CALLS]", "[ARGS]"


def call(obj, args_key: str = "arguments") -> tuple[str, str] | None:
    """A parsed JSON value -> (name, arguments as JSON text), or None when it is no call."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(args_key, obj.get("parameters" if args_key == "arguments" else "arguments", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    return (obj["name"], json.dumps(args, ensure_ascii=False)) if isinstance(args, dict) else None


def objects(text: str) -> list | None:
    """JSON values separated by `;` or whitespace (llama3_json's parallel calls), or None if any is not JSON."""
    decoder, out, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(text) and text[i] in " \t\r\n;":
            i += 1
        if i == len(text):
            return out
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return None
        out.append(obj)


def calls(values) -> list | None:
    pairs = [call(v) for v in values or [None]]
    return None if None in pairs else pairs


def llama3_json(text: str) -> list | None:
    return calls(objects(text.lstrip().removeprefix(PYTHON_TAG)))


def pythonic(text: str) -> list | None:
    text = text.strip().removeprefix(PYTHON_START).removesuffix(PYTHON_END).strip()
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    pairs = []
    for node in tree.elts:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
            return None
        try:
            args = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None}
        except ValueError:  # not a literal (a name, an expression): no call we can pass on as JSON
            return None
        if len(args) != len(node.keywords):  # **kwargs
            return None
        pairs.append((node.func.id, json.dumps(args, ensure_ascii=False)))
    return pairs


def mistral(text: str) -> list | None:
    parts = [p for p in text.split(TOOL_CALLS) if p.strip()]
    if len(parts) == 1 and ARGS not in parts[0]:  # v3: one JSON array (or object) of calls
        values = objects(parts[0])
        return calls(values[0] if values and len(values) == 1 and isinstance(values[0], list) else values)
    pairs = []
    for part in parts:  # v11+: name[ARGS]{...} per call
        name, sep, args = part.partition(ARGS)
        pair = call({"name": name.strip(), "arguments": args.strip()}) if sep else None
        if pair is None or not pair[0]:
            return None
        pairs.append(pair)
    return pairs or None


@dataclass(frozen=True)
class Format:
    markers: tuple[str, ...]  # what opens the calls (kept in the text parse reads)
    anywhere: bool            # content may come before the calls (else the reply opens with them or is content)
    tags: tuple[str, ...]     # the special tokens the text must keep for the parse to see them
    parse: Callable[[str], list | None]


FORMATS = {"llama3_json": Format((PYTHON_TAG, "{"), False, (PYTHON_TAG,), llama3_json),
           "pythonic": Format((PYTHON_START, "["), False, (PYTHON_START, PYTHON_END), pythonic),
           "mistral": Format((TOOL_CALLS,), True, (TOOL_CALLS, ARGS), mistral)}
