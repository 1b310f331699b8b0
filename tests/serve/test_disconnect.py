"""A non-streamed request whose client leaves: its choices are cancelled and the app answers 499 (nginx's "client
closed request"), as normal traffic; it raised CancelledError out of the app, which uvicorn logs as an ERROR with a
traceback for every such request."""
import asyncio
import json
import time

import pytest


async def call(app, path: str, body: dict, leave_after: float) -> list[dict]:
    """Drive the ASGI app as a server would, with a client that disconnects `leave_after` s after sending."""
    raw = json.dumps(body).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}
    sent, start, first = [], time.monotonic(), [True]

    async def receive():
        if first[0]:
            first[0] = False
            return {"type": "http.request", "body": raw, "more_body": False}
        if time.monotonic() - start >= leave_after:
            return {"type": "http.disconnect"}
        await asyncio.Event().wait()  # Starlette polls with a cancelled scope: nothing yet

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    return sent


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
    ("/v1/completions", {"prompt": "Hi", "n": 2}),
    ("/v1/messages", {"messages": [{"role": "user", "content": "Hi"}]}),
    ("/v1/responses", {"input": "Hi"}),
    ("/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 100, "ignore_eos": True}})])
def test_a_client_leaving_a_non_streamed_request_is_answered_499_and_its_rows_freed(tiny_target, in_process_app,
                                                                                      path, body):
    with in_process_app(tiny_target, max_len=256) as (app, engine):
        real = engine.step

        def slow(*args, **kwargs):  # a bigger model's pace: the request is still running when the client leaves
            time.sleep(0.05)
            return real(*args, **kwargs)

        engine.step = slow
        body = {"max_tokens": 100, "ignore_eos": True, **body} if path != "/generate" else body
        if path == "/v1/messages":
            body = {"model": "tiny", "max_tokens": 100, "messages": body["messages"]}
        sent = asyncio.run(call(app, path, body, leave_after=0.3))
        assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 499, sent[:1]
        deadline = time.time() + 10
        while engine.running and time.time() < deadline:
            time.sleep(0.05)
        assert not engine.running
