"""Who may call the server: `toolkit serve --api-key KEY [KEY ...]` (or $TOOLKIT_API_KEY) and `--allowed-origins`.

With keys, every path but the probes (/health, /ping, /version, /metrics) needs `Authorization: Bearer KEY`, as
vLLM's and SGLang's --api-key guard their routes, or `x-api-key: KEY` (what the anthropic client sends); a missing or
wrong key gets a 401 (OpenAI's code invalid_api_key; Anthropic's authentication_error on /v1/messages), which
either client raises as AuthenticationError. Keys are compared as SHA-256 digests in constant time, each
of them every time, so the answer's timing says nothing about how much of a key was right.

With origins, browsers on those origins (or any, with "*") may call the API cross-origin (CORS); preflight OPTIONS
requests are answered before the key check, as browsers send them without credentials. Without, no CORS headers
are sent and browsers keep pages of other origins out.
"""
from __future__ import annotations

import hashlib
import secrets

from starlette.datastructures import Headers
from starlette.responses import JSONResponse

from toolkit.serve.anthropic import error_body
from toolkit.serve.api_error import ApiError

PUBLIC = ("/health", "/ping", "/version", "/metrics")  # probes and scraping stay open, as vLLM keeps them


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


class ApiKeys:
    """ASGI middleware: requests outside PUBLIC need one of `keys` as a bearer token."""

    def __init__(self, app, keys: list[str]):
        if not keys or any(not k for k in keys):
            raise ValueError("--api-key: give one or more non-empty keys")
        self.app, self.digests = app, [_digest(k) for k in keys]

    def allows(self, headers: Headers) -> bool:
        scheme, _, token = (headers.get("authorization") or "").partition(" ")
        if scheme.lower() != "bearer":
            token = headers.get("x-api-key") or ""
        given, match = _digest(token.strip()), False
        for digest in self.digests:  # every key compared, found or not
            match |= secrets.compare_digest(given, digest)
        return match

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] == "OPTIONS" or scope["path"] in PUBLIC or self.allows(
                Headers(scope=scope)):
            return await self.app(scope, receive, send)
        err = ApiError(401, "Incorrect or missing API key: send the server's key as `Authorization: Bearer KEY` "
                            "(the openai client's api_key) or `x-api-key: KEY` (the anthropic client's)", None,
                       "invalid_api_key")
        body = error_body(401, err.message) if scope["path"].startswith("/v1/messages") else err.body()
        await JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)


def guarded(app, api_keys: list[str] | None = None, allowed_origins: list[str] | None = None):
    """`app` behind the key check (when keys are given) and CORS for `allowed_origins` (when given), CORS outside
    so that a browser's preflight is answered without a key."""
    if api_keys:
        app = ApiKeys(app, api_keys)
    if allowed_origins:
        from starlette.middleware.cors import CORSMiddleware

        app = CORSMiddleware(app, allow_origins=allowed_origins, allow_methods=["*"], allow_headers=["*"])
    return app
