"""ASGI middleware in front of the API: refuses bodies over the size limit with a 413 before anything parses
them (whether or not the client sent Content-Length), and counts every response by endpoint and status."""
from __future__ import annotations

import json

from toolkit.serve.api_error import ApiError
from toolkit.serve.metrics import ServerMetrics


KEYED = ("/v1/models", "/v1/responses", "/v1/files", "/v1/batches", "/v1/messages/batches")  # /{id} below them
ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens",
          "/v1/messages/batches", "/v1/models", "/v1/files", "/v1/batches", "/generate", "/health", "/metrics")


class Gate:
    def __init__(self, app, max_body_bytes: int, metrics: ServerMetrics):
        self.app, self.limit, self.metrics = app, max_body_bytes, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        # a fixed set of labels: a label per path any client may send would grow /metrics without bound
        path = scope["path"] if scope["path"] in ROUTES else next(
            (f"{r}/{{id}}" for r in KEYED if scope["path"].startswith(r + "/")), "other")

        async def counted_send(message):
            if message["type"] == "http.response.start":
                self.metrics.requests.labels(endpoint=path, code=str(message["status"])).inc()
            await send(message)

        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await self._too_large(counted_send, scope["path"])
        chunks, total = [], 0
        while True:  # read the body here, counting, so a chunked upload cannot slip past the limit
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            total += len(chunks[-1])
            if total > self.limit:
                return await self._too_large(counted_send, scope["path"])
            if not message.get("more_body"):
                break
        body, replayed = b"".join(chunks), False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # later: the disconnect, for streaming responses

        await self.app(scope, replay, counted_send)

    async def _too_large(self, send, path: str) -> None:
        from toolkit.serve.anthropic import error_body, messages_path

        err = ApiError(413, f"request body is over the limit of {self.limit} bytes (--max-body-bytes)", None,
                       "body_too_large")
        payload = json.dumps(error_body(413, err.message) if messages_path(path) else err.body()).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})
