"""A chat reply read for tool calls, whole or as it streams: OpenAI's `tool_calls` out of the text the model wrote.

How the calls are written depends on the request's `tool_choice` and, for `auto`, on the server's
`--tool-call-parser` (vLLM's flag and names):

  hermes       Hermes 2/3, Qwen2.5, Qwen3: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block per
               call, text around them is content (whitespace between calls dropped).
  llama3_json, pythonic, mistral
               calls that end the reply, after a marker (tool_formats.py)
  openai       gpt-oss (harmony): a message addressed `to=functions.NAME` is a call, its body the arguments; read
               by the gpt_oss reasoning parser's split (toolkit/data/harmony.py), which the server pairs it with
  required     (tool_choice "required") the reply is a JSON array of {"name", "parameters"}: the grammar the
               request was served with makes it one (toolkit/serve/tools.py).
  named        (tool_choice naming a function) the reply is that function's arguments, streamed as written.

SGLang's names are taken too (qwen25 and qwen = hermes, llama3 = llama3_json, gpt-oss = openai). A block or reply
that does not parse as a call is content, so nothing the model wrote is lost (openai's recipient makes a message a
call whatever its body). Streamed, content goes out as it comes except a tail that could still open a call; a call
goes out whole once its block closes or the reply ends (the named function's arguments piece by piece). The
deltas of any chunking join to the whole reading (a test checks).
"""
from __future__ import annotations

import json
import uuid

from toolkit.held import held
from toolkit.serve.tool_formats import FORMATS, call

PARSERS = ("hermes", *FORMATS, "openai")
# SGLang's names for the same formats
ALIASES = {"qwen25": "hermes", "qwen": "hermes", "llama3": "llama3_json", "gpt-oss": "openai", "gpt_oss": "openai"}
OPEN, CLOSE = "<tool_call>", "</tool_call>"
# kept in the parser's text (harmony's headers are kept for the reasoning parser that reads openai's calls)
TAGS = {"hermes": (OPEN, CLOSE), **{name: f.tags for name, f in FORMATS.items()}, "openai": ()}


class ToolCallReader:
    """One choice's reply -> content deltas and tool-call deltas (OpenAI's streamed `tool_calls` items)."""

    def __init__(self, mode: str, name: str | None = None, parallel: bool = True):
        if mode not in (*PARSERS, "required", "named"):
            raise ValueError(f"tool-call parser {mode!r}: accepted {', '.join(PARSERS)}")
        self.mode, self.name, self.parallel = mode, name, parallel
        self.pending = ""    # text not yet given out as content or read as a call
        self.inside = False  # hermes: within a <tool_call> block; the other formats: past the marker
        # formats whose calls open the reply: its first characters decide whether it is calls or content
        self.decided = mode not in FORMATS or FORMATS[mode].anywhere
        self.calls = 0       # calls given out (their indices)

    def _new(self, name: str, arguments: str) -> dict:
        self.calls += 1
        return {"index": self.calls - 1, "id": f"chatcmpl-tool-{uuid.uuid4().hex}", "type": "function",
                "function": {"name": name, "arguments": arguments}}

    def _take(self, pairs: list[tuple[str, str]]) -> list[dict]:
        """New calls, at most one in all without parallel tool calls."""
        return [self._new(*p) for p in pairs if self.parallel or self.calls == 0]

    def feed(self, text: str, done: bool = False, found=()) -> tuple[str, list[dict]]:
        """The reply's next piece -> (content delta, tool-call deltas); done: the reply is whole, flush all.
        openai: `text` is content as it is, `found` the (name, arguments) calls harmony's split read."""
        if self.mode == "openai":
            return text, self._take(found)
        self.pending += text
        if self.mode == "named":
            return self._named(done)
        if self.mode == "required":
            return self._required(done)
        if self.mode in FORMATS:
            return self._tail(done)
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
        pairs = [call(v, "parameters") for v in value] if isinstance(value, list) else [None]
        return (text, []) if not pairs or None in pairs else ("", self._take(pairs))

    def _tail(self, done: bool) -> tuple[str, list[dict]]:
        """Content, then (from the format's marker) calls to the end of the reply, read once it is whole."""
        fmt, content = FORMATS[self.mode], ""
        if not self.inside and fmt.anywhere:  # content streams until a marker (a tail that may become one waits)
            starts = [i for i in (self.pending.find(m) for m in fmt.markers) if i >= 0]
            keep = 0 if starts or done else max(held(self.pending, m) for m in fmt.markers)
            cut = min(starts) if starts else len(self.pending) - keep
            content, self.pending, self.inside = self.pending[:cut], self.pending[cut:], bool(starts)
            if not self.inside:
                return content, []
        elif not self.inside:  # the reply's first characters decide: calls, or content throughout
            if not self.decided:
                head = self.pending.lstrip()
                if not done and (not head or any(m.startswith(head) and m != head for m in fmt.markers)):
                    return "", []  # nothing yet, or it may still become a marker
                self.decided, self.inside = True, head.startswith(fmt.markers)
            if not self.inside:
                content, self.pending = self.pending, ""
                return content, []
        if not done:
            return content, []
        text, self.pending = self.pending, ""
        pairs = fmt.parse(text)
        return (content + text, []) if pairs is None else (content, self._take(pairs))

    def _hermes(self, done: bool) -> tuple[str, list[dict]]:
        content, calls = "", []
        while True:
            if not self.inside:
                start = self.pending.find(OPEN)
                if start < 0:  # content, but a tail that may open a call waits; so does whitespace after a call
                    keep = 0 if done else held(self.pending, OPEN)
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
                pair = call(json.loads(block))
            except json.JSONDecodeError:
                pair = None
            if pair is None:  # not a call: the block as the model wrote it
                content += OPEN + block + ("" if end < 0 else CLOSE)
            else:
                calls += self._take([pair])
            if end < 0:
                return content, calls
