"""A chat reply read for tool calls, whole or as it streams: OpenAI's `tool_calls` out of the text the model wrote.

How the calls are written depends on the request's `tool_choice` and, for `auto`, on the server's
`--tool-call-parser` (vLLM's flag and names):

  hermes       Hermes 2/3, Qwen2.5, Qwen3: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block per
               call, text around them is content (whitespace between calls dropped).
  llama3_json  Llama 3.1 / 3.2 JSON tool calling: a reply that opens with `<|python_tag|>` or `{` is calls,
               `{"name": ..., "parameters": {...}}` separated by `;`; any other reply is content.
  required     (tool_choice "required") the reply is a JSON array of {"name", "parameters"}: the grammar the
               request was served with makes it one (toolkit/serve/tools.py).
  named        (tool_choice naming a function) the reply is that function's arguments, streamed as written.

SGLang's names are taken too (qwen25 and qwen = hermes, llama3 = llama3_json). A block or reply that does not
parse as a call is content, so nothing the model wrote is lost. Streamed, content
goes out as it comes except a tail that could still open a call; a call goes out whole once its block closes (the
named function's arguments piece by piece). The deltas of any chunking join to the whole reading (a test checks).
"""
from __future__ import annotations

import json
import uuid

PARSERS = ("hermes", "llama3_json")
ALIASES = {"qwen25": "hermes", "qwen": "hermes", "llama3": "llama3_json"}  # SGLang's names for the same formats
OPEN, CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
TAGS = {"hermes": (OPEN, CLOSE), "llama3_json": (PYTHON_TAG,)}  # kept in the text the parser reads


def _held(text: str, tag: str) -> int:
    """How many trailing characters of `text` could be the start of `tag`."""
    return max((k for k in range(1, len(tag)) if text.endswith(tag[:k])), default=0)


def _call(obj, args_key: str = "arguments") -> tuple[str, str] | None:
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


def _objects(text: str) -> list | None:
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


class ToolCallReader:
    """One choice's reply -> content deltas and tool-call deltas (OpenAI's streamed `tool_calls` items)."""

    def __init__(self, mode: str, name: str | None = None, parallel: bool = True):
        if mode not in (*PARSERS, "required", "named"):
            raise ValueError(f"tool-call parser {mode!r}: accepted {', '.join(PARSERS)}")
        self.mode, self.name, self.parallel = mode, name, parallel
        self.pending = ""    # text not yet given out as content or read as a call
        self.inside = False  # hermes: within a <tool_call> block; llama3_json: the reply is calls
        self.decided = mode != "llama3_json"  # llama3_json: the reply's first characters decide
        self.calls = 0       # calls given out (their indices)

    def _new(self, name: str, arguments: str) -> dict:
        self.calls += 1
        return {"index": self.calls - 1, "id": f"chatcmpl-tool-{uuid.uuid4().hex}", "type": "function",
                "function": {"name": name, "arguments": arguments}}

    def _take(self, pairs: list[tuple[str, str]]) -> list[dict]:
        """New calls, at most one in all without parallel tool calls."""
        return [self._new(*p) for p in pairs if self.parallel or self.calls == 0]

    def feed(self, text: str, done: bool = False) -> tuple[str, list[dict]]:
        """The reply's next piece -> (content delta, tool-call deltas); done: the reply is whole, flush all."""
        self.pending += text
        if self.mode == "named":
            return self._named(done)
        if self.mode == "required":
            return self._required(done)
        if self.mode == "llama3_json":
            return self._llama3(done)
        return self._hermes(done)

    def _named(self, done: bool) -> tuple[str, list[dict]]:
        piece, self.pending = self.pending, ""
        if self.calls == 0 and (piece or done):  # the first delta names the call, the rest add arguments
            return "", [self._new(self.name, piece)]
        return "", [{"index": 0, "function": {"arguments": piece}}] if piece else []

    def _required(self, done: bool) -> tuple[str, list[dict]]:
        if not done:
            return "", []
        text, self.pending = self.pending, ""
        try:
            value = json.loads(text)
        except json.JSONDecodeError:  # cut short by max_tokens or a stop string
            return text, []
        pairs = [_call(v, "parameters") for v in value] if isinstance(value, list) else [None]
        return (text, []) if not pairs or None in pairs else ("", self._take(pairs))

    def _llama3(self, done: bool) -> tuple[str, list[dict]]:
        if not self.decided:
            head = self.pending.lstrip()
            if not done and (not head or (PYTHON_TAG.startswith(head) and head != PYTHON_TAG)):
                return "", []  # nothing yet, or it may still become <|python_tag|>
            self.decided, self.inside = True, head.startswith((PYTHON_TAG, "{"))
        if not self.inside:
            content, self.pending = self.pending, ""
            return content, []
        if not done:
            return "", []
        text, self.pending = self.pending, ""
        objects = _objects(text.lstrip().removeprefix(PYTHON_TAG))
        pairs = [_call(o) for o in objects] if objects else [None]
        return (text, []) if None in pairs else ("", self._take(pairs))

    def _hermes(self, done: bool) -> tuple[str, list[dict]]:
        content, calls = "", []
        while True:
            if not self.inside:
                start = self.pending.find(OPEN)
                if start < 0:  # content, but a tail that may open a call waits; so does whitespace after a call
                    keep = 0 if done else _held(self.pending, OPEN)
                    out = self.pending[:len(self.pending) - keep]
                    if self.calls and not out.strip() and not done:
                        return content, calls
                    content += out if out.strip() or not self.calls else ""
                    self.pending = self.pending[len(self.pending) - keep:]
                    return content, calls
                before = self.pending[:start]
                content += before if before.strip() or not self.calls else ""
                self.pending, self.inside = self.pending[start + len(OPEN):], True
            end = self.pending.find(CLOSE)
            if end < 0 and not done:
                return content, calls
            block = self.pending if end < 0 else self.pending[:end]
            self.pending = "" if end < 0 else self.pending[end + len(CLOSE):]
            self.inside = False
            try:
                pair = _call(json.loads(block))
            except json.JSONDecodeError:
                pair = None
            if pair is None:  # not a call: the block as the model wrote it
                content += OPEN + block + ("" if end < 0 else CLOSE)
            else:
                calls += self._take([pair])
            if end < 0:
                return content, calls
