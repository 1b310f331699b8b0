"""Batch files as OpenAI's Batch API and `vllm run-batch` take them, and as Anthropic's Message Batches hold their
requests: read and checked whole before anything runs, then each answer written as a line of the output file.

OpenAI lines (`/v1/chat/completions`, `/v1/completions`, `/v1/responses`, `/v1/messages`):

    {"custom_id": "q1", "method": "POST", "url": "/v1/chat/completions", "body": {"model": ..., "messages": [...]}}
 -> {"id": "batch_req_...", "custom_id": "q1", "response": {"status_code": 200, "request_id": "req_...",
     "body": {...the endpoint's response...}}, "error": null}

A request the endpoint refuses keeps its status and error body in `response` (as OpenAI's output file does);
`error` ({"code", "message"}) is for a failure that never got an HTTP answer. Anthropic lines (`params` is a
/v1/messages body):

    {"custom_id": "q1", "params": {"model": ..., "max_tokens": 256, "messages": [...]}}
 -> {"custom_id": "q1", "result": {"type": "succeeded", "message": {...}}}  (or "errored" with the error body)
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from pathlib import Path

ANTHROPIC_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")
URLS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages")


@dataclass(frozen=True)
class BatchLine:
    index: int        # 0-based position among the file's requests (blank lines skipped)
    line: int         # 1-based line number in the file
    custom_id: str
    url: str
    body: dict
    anthropic: bool   # an Anthropic Message Batches request: output in its `result` shape

    def output(self, status: int, body: dict | None) -> dict:
        """This request's output line, from the endpoint's status and JSON body."""
        if self.anthropic:
            ok = status == 200
            return {"custom_id": self.custom_id,
                    "result": {"type": "succeeded", "message": body} if ok else {"type": "errored", "error": body}}
        return {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": self.custom_id,
                "response": {"status_code": status, "request_id": f"req_{uuid.uuid4().hex}", "body": body},
                "error": None}

    def failed(self, message: str) -> dict:
        """The output line of a request that got no HTTP answer at all (the endpoint raised)."""
        if self.anthropic:
            return {"custom_id": self.custom_id, "result": {"type": "errored", "error": {
                "type": "error", "error": {"type": "api_error", "message": message}}}}
        return {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": self.custom_id, "response": None,
                "error": {"code": "internal_error", "message": message}}


def _one(data, index: int, number: int, where: str) -> BatchLine:
    if not isinstance(data, dict):
        raise ValueError(f"{where}: a line must be a JSON object, got {type(data).__name__}")
    custom_id = data.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise ValueError(f"{where}: custom_id must be a non-empty string (it pairs the answer with the request), "
                         f"got {custom_id!r}")
    if "params" in data and "url" not in data:  # Anthropic's {custom_id, params}
        url, body, anthropic = "/v1/messages", data["params"], True
        if not ANTHROPIC_ID.fullmatch(custom_id):
            raise ValueError(f"{where}: custom_id {custom_id!r}: Anthropic's are 1-64 letters, digits, _ and -")
        extra = set(data) - {"custom_id", "params"}
    else:
        method, url, body, anthropic = data.get("method"), data.get("url"), data.get("body"), False
        if method != "POST":
            raise ValueError(f"{where}: method must be \"POST\", got {method!r}")
        if url not in URLS:
            raise ValueError(f"{where}: url {url!r} is not answered here; accepted: {', '.join(URLS)}")
        extra = set(data) - {"custom_id", "method", "url", "body"}
    if extra:
        raise ValueError(f"{where}: unknown field{'s' if len(extra) > 1 else ''} {', '.join(sorted(extra))}; a line "
                         "holds custom_id, method, url and body (OpenAI), or custom_id and params (Anthropic)")
    if not isinstance(body, dict):
        raise ValueError(f"{where}: {'params' if anthropic else 'body'} must be a JSON object (the request "
                         f"{url} takes), got {type(body).__name__}")
    if body.get("stream"):
        raise ValueError(f"{where}: stream is true; a batch request is answered whole: drop stream")
    return BatchLine(index, number, custom_id, url, body, anthropic)


def batch_lines(items, name: str, endpoint: str | None = None) -> list[BatchLine]:
    """The requests of `items` ((number, parsed JSON, where) each), or a ValueError naming the first bad one (by
    its `where`) and what a request must hold. All are one kind (OpenAI or Anthropic), no custom_id appears twice,
    and with `endpoint` (a /v1/batches job's) every url is that one."""
    lines: list[BatchLine] = []
    seen: dict[str, str] = {}
    for number, data, where in items:
        line = _one(data, len(lines), number, where)
        if line.custom_id in seen:
            raise ValueError(f"{where}: custom_id {line.custom_id!r} repeats {seen[line.custom_id]}'s; each request "
                             "needs its own")
        if lines and line.anthropic != lines[0].anthropic:
            raise ValueError(f"{where}: an {'Anthropic' if line.anthropic else 'OpenAI'} request among "
                             f"{'Anthropic' if lines[0].anthropic else 'OpenAI'} ones; a batch holds one kind")
        if endpoint is not None and (line.anthropic or line.url != endpoint):
            raise ValueError(f"{where}: url {line.url if not line.anthropic else None!r} is not the batch's "
                             f"endpoint {endpoint}; every line of a batch goes to its endpoint")
        seen[line.custom_id] = where
        lines.append(line)
    if not lines:
        raise ValueError(f"{name}: no requests in it (one JSON object per line)")
    return lines


def parse_batch(texts, name: str, endpoint: str | None = None) -> list[BatchLine]:
    """Every request of a batch file's lines (`texts`; blank ones skipped), as batch_lines checks them, each bad
    one named "NAME line N"."""
    from toolkit.serve.json_body import unpaired_surrogate

    def decoded():
        for number, text in enumerate(texts, 1):
            if text.strip():
                where = f"{name} line {number}"
                try:
                    line = json.loads(text)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{where}: not JSON ({e.msg} at column {e.colno}); a batch file holds one JSON "
                                     "object per line") from None
                if why := unpaired_surrogate(line):
                    raise ValueError(f"{where}: {why}")
                yield number, line, where

    return batch_lines(decoded(), name, endpoint)


def read_batch(path: str | Path) -> list[BatchLine]:
    """Every request of the batch file at `path` (see parse_batch)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--input-file {path}: no such file")
    with path.open("rb") as f:
        return parse_batch(_utf8_lines(f, str(path)), str(path))


def parse_batch_bytes(data: bytes, name: str, endpoint: str | None = None) -> list[BatchLine]:
    """parse_batch over a batch file's bytes (fetched from a URL, uploaded): split at "\n" alone, as a file is
    read, not at every line break str.splitlines knows (JSON strings may hold U+2028 raw), its BOM skipped."""
    import io

    return parse_batch(_utf8_lines(io.BytesIO(data), name), name, endpoint)


def _utf8_lines(f, name: str):
    """The file's lines as text; one that is not UTF-8 is named with its line."""
    for number, raw in enumerate(f, 1):
        try:
            yield raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{name} line {number}: not UTF-8 (byte {raw[e.start]:#04x} at column {e.start + 1}); "
                             "a batch file is UTF-8 JSON lines") from None
