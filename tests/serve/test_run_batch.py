"""`toolkit run-batch`: batch files read and refused line by line, answers in the input's order with the status and
body the endpoint gives, Anthropic's request shape, and the CLI lossless against plain decoding."""
from __future__ import annotations

import asyncio
import json

import pytest

from toolkit.cli import main
from toolkit.serve.batch_file import read_batch
from toolkit.serve.run_batch import answer


def write(path, rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def chat(cid: str, text: str, **extra) -> dict:
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": text}], "max_tokens": 6, "temperature": 0, **extra}}


def test_read_batch_takes_every_endpoint_and_skips_blank_lines(tmp_path):
    rows = [chat("a", "hi"), "", {"custom_id": "b", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}},
            {"custom_id": "c", "method": "POST", "url": "/v1/responses", "body": {"input": "x"}},
            {"custom_id": "d", "method": "POST", "url": "/v1/messages", "body": {"messages": [], "max_tokens": 1}}]
    lines = read_batch(write(tmp_path / "in.jsonl", rows))
    assert [(x.index, x.line, x.custom_id, x.url, x.anthropic) for x in lines] == [
        (0, 1, "a", "/v1/chat/completions", False), (1, 3, "b", "/v1/completions", False),
        (2, 4, "c", "/v1/responses", False), (3, 5, "d", "/v1/messages", False)]
    anthropic = read_batch(write(tmp_path / "a.jsonl", [{"custom_id": "x", "params": {"max_tokens": 1}}]))
    assert anthropic[0].url == "/v1/messages" and anthropic[0].anthropic


@pytest.mark.parametrize("rows, message", [
    (["{not json"], "line 1: not JSON"),
    ([[1, 2]], "line 1: a line must be a JSON object, got list"),
    ([{"method": "POST", "url": "/v1/completions", "body": {}}], "line 1: custom_id must be a non-empty string"),
    ([chat("a", "x"), chat("a", "y")], "in.jsonl line 2: custom_id 'a' repeats "),
    ([{**chat("a", "x"), "method": "GET"}], "line 1: method must be \"POST\", got 'GET'"),
    ([{**chat("a", "x"), "url": "/v1/embeddings"}], "url '/v1/embeddings' is not answered here; accepted: "
                                                     "/v1/chat/completions"),
    ([{**chat("a", "x"), "body": "hi"}], "body must be a JSON object (the request /v1/chat/completions takes)"),
    ([chat("a", "x", stream=True)], "line 1: stream is true; a batch request is answered whole"),
    ([{**chat("a", "x"), "extra": 1}], "line 1: unknown field extra"),
    ([chat("a", "x"), {"custom_id": "b", "params": {}}], "line 2: an Anthropic request among OpenAI ones"),
    (["", "  "], "no requests in it"),
    (['{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "a\\ud800"}}'],
     "line 1: an unpaired surrogate escape ('\\ud800'), not valid Unicode"),  # once "no answer: UnicodeEncodeError"
])
def test_read_batch_names_the_bad_line(tmp_path, rows, message):
    with pytest.raises(ValueError) as err:
        read_batch(write(tmp_path / "in.jsonl", rows))
    assert message in str(err.value)


def test_a_line_that_is_not_utf8_is_named(tmp_path):
    f = tmp_path / "in.jsonl"
    f.write_bytes(json.dumps(chat("a", "x")).encode() + b"\n\xff\xfe{}\n")
    with pytest.raises(ValueError, match=f"{f} line 2: not UTF-8 \\(byte 0xff at column 1\\)"):
        read_batch(f)
    f.write_bytes(b"\xef\xbb\xbf" + json.dumps(chat("a", "x")).encode() + b"\n")  # a byte-order mark first
    assert [line.custom_id for line in read_batch(f)] == ["a"]


def test_answers_in_input_order_with_each_endpoint_status_and_body(tiny_target, in_process_app, tmp_path):
    from fastapi.testclient import TestClient

    rows = [chat("long", "Tell me a story", max_tokens=12), chat("short", "Hi", max_tokens=2),
            {"custom_id": "cmpl", "method": "POST", "url": "/v1/completions",
             "body": {"prompt": "The sky is", "max_tokens": 5, "temperature": 0}},
            {"custom_id": "resp", "method": "POST", "url": "/v1/responses",
             "body": {"input": "Hi", "max_output_tokens": 4, "temperature": 0}},
            {"custom_id": "msg", "method": "POST", "url": "/v1/messages",
             "body": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}},
            chat("bad", "x", temperature=-1), chat("other-model", "x", model="gpt-4o")]
    lines = read_batch(write(tmp_path / "in.jsonl", rows))
    out = tmp_path / "out.jsonl"
    with in_process_app(tiny_target) as (app, _):
        tally = asyncio.run(answer(app, lines, out, concurrency=3))
        with TestClient(app) as client:  # the same requests one at a time, straight to the endpoints
            direct = [client.post(x.url, json=x.body) for x in lines]
    got = [json.loads(s) for s in out.read_text().splitlines()]
    assert [g["custom_id"] for g in got] == [r["custom_id"] for r in rows]
    assert [g["response"]["status_code"] for g in got] == [d.status_code for d in direct] == [200] * 5 + [400, 404]
    assert all(g["id"].startswith("batch_req_") and g["response"]["request_id"].startswith("req_")
               and g["error"] is None for g in got)
    bodies = [g["response"]["body"] for g in got]
    assert bodies[0]["choices"][0]["message"] == direct[0].json()["choices"][0]["message"]  # greedy: the same text
    assert bodies[0]["usage"]["completion_tokens"] == 12 and bodies[1]["usage"]["completion_tokens"] == 2
    assert bodies[2]["choices"][0]["text"] == direct[2].json()["choices"][0]["text"]
    assert bodies[3]["object"] == "response" and bodies[3]["output"][0]["content"] == direct[3].json()["output"][0]["content"]
    assert bodies[4]["type"] == "message" and bodies[4]["content"] == direct[4].json()["content"]
    assert bodies[5]["error"]["param"] == "temperature" and bodies[6]["error"]["code"] == "model_not_found"
    assert tally.ok == 5 and tally.failed == {400: 1, 404: 1}
    assert tally.output_tokens == 12 + 2 + 5 + 4 + 4
    assert tally.first_failure.startswith("line 6 (bad): 400 temperature")


def test_anthropic_batch_requests_give_succeeded_and_errored_results(tiny_target, in_process_app, tmp_path):
    rows = [{"custom_id": "ok", "params": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}},
            {"custom_id": "no-max", "params": {"messages": [{"role": "user", "content": "Hi"}]}}]
    out = tmp_path / "out.jsonl"
    with in_process_app(tiny_target) as (app, _):
        asyncio.run(answer(app, read_batch(write(tmp_path / "in.jsonl", rows)), out, concurrency=2))
    ok, bad = [json.loads(s) for s in out.read_text().splitlines()]
    assert ok["custom_id"] == "ok" and ok["result"]["type"] == "succeeded"
    assert ok["result"]["message"]["type"] == "message" and ok["result"]["message"]["usage"]["output_tokens"] == 3
    assert bad == {"custom_id": "no-max", "result": {"type": "errored", "error": {
        "type": "error", "error": {"type": "invalid_request_error", "message": bad["result"]["error"]["error"][
            "message"]}}}} and "max_tokens" in bad["result"]["error"]["error"]["message"]


def test_a_request_the_endpoint_raises_on_gets_an_error_line_and_the_rest_go_on(tmp_path):
    async def app(scope, receive, send):  # an ASGI app that answers one path and raises on another
        if scope["path"] == "/v1/completions":
            raise RuntimeError("engine thread stopped")
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"usage": {"completion_tokens": 3}}'})

    rows = [{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}}, chat("b", "y")]
    out = tmp_path / "out.jsonl"
    tally = asyncio.run(answer(app, read_batch(write(tmp_path / "in.jsonl", rows)), out, concurrency=1))
    a, b = [json.loads(s) for s in out.read_text().splitlines()]
    assert a["response"] is None and a["error"] == {"code": "internal_error",
                                                    "message": "RuntimeError: engine thread stopped"}
    assert b["response"]["status_code"] == 200 and tally.ok == 1 and tally.output_tokens == 3


def test_cli_speculative_batch_is_lossless_and_reports_tau(tiny_target, random_draft, tmp_path, capsys):
    draft = random_draft(tiny_target, tmp_path / "draft", str(tiny_target))
    rows = [chat(f"q{i}", text, max_tokens=16) for i, text in enumerate(
        ["Write a poem", "What is 2+2?", "Name three colors", "Explain gravity", "Hello"])]
    src = write(tmp_path / "in.jsonl", rows)
    common = ["run-batch", "-i", src, "--model", str(tiny_target), "--threads", "1", "--log-every", "0",
              "--max-batch-size", "2", "--max-seq-len", "256"]
    assert main([*common, "-o", str(tmp_path / "spec.jsonl"), "--draft", str(draft), "--num-steps", "3"]) == 0
    summary = capsys.readouterr().out
    assert main([*common, "-o", str(tmp_path / "plain.jsonl"), "--no-speculation"]) == 0
    spec, plain = ([json.loads(s) for s in (tmp_path / f).read_text().splitlines()] for f in ("spec.jsonl", "plain.jsonl"))
    text = lambda g: g["response"]["body"]["choices"][0]["message"]["content"]  # noqa: E731
    assert [text(g) for g in spec] == [text(g) for g in plain]  # greedy speculation changes no token
    steps = sum(g["response"]["body"]["usage"]["speculative"]["verify_steps"] for g in spec)
    assert steps > 0 and "5 requests, 5 answered in" in summary and " verify steps; wrote " in summary
    assert f"over {steps} verify steps" in summary


def test_cli_refuses_a_bad_file_before_loading_and_writes_nothing(tmp_path, capsys):
    src = write(tmp_path / "in.jsonl", [chat("a", "x"), {**chat("b", "y"), "url": "/v1/embeddings"}])
    code = main(["run-batch", "-i", src, "-o", str(tmp_path / "out.jsonl"), "--model", str(tmp_path / "absent")])
    assert code == 2 and "line 2: url '/v1/embeddings' is not answered here" in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()
    good = write(tmp_path / "good.jsonl", [chat("a", "x")])
    assert main(["run-batch", "-i", good, "-o", good, "--no-speculation"]) == 2
    assert "--output-file is the input file" in capsys.readouterr().err


class Store:
    """A local stand-in for an object store: GET /in.jsonl serves the batch, PUT /out.jsonl keeps what is sent
    (or answers 500 `fail` times first)."""

    def __init__(self, batch: bytes, fail: int = 0):
        import http.server
        import threading

        store = self
        self.batch, self.fail, self.put, self.tries = batch, fail, None, 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                found = self.path == "/in.jsonl"
                self.send_response(200 if found else 404)
                self.end_headers()
                self.wfile.write(store.batch if found else b"")

            def do_PUT(self):
                store.tries += 1
                data = self.rfile.read(int(self.headers["Content-Length"]))
                if store.tries <= store.fail:
                    self.send_response(500)
                else:
                    store.put = data
                    self.send_response(200)
                self.end_headers()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_cli_reads_a_url_and_puts_the_answers_to_one(tiny_target, tmp_path, capsys, monkeypatch):
    from toolkit.serve import run_batch

    monkeypatch.setattr(run_batch, "UPLOAD_WAIT", 0.01)
    rows = [chat("a", "Hello", max_tokens=3), chat("b", "Bye", max_tokens=2)]
    store = Store("".join(json.dumps(r) + "\n" for r in rows).encode(), fail=2)  # two failed PUTs, then one lands
    common = ["run-batch", "--model", str(tiny_target), "--no-speculation", "--threads", "1", "--log-every", "0",
              "--max-seq-len", "128", "--output-tmp-dir", str(tmp_path)]
    try:
        assert main([*common, "-i", f"{store.url}/in.jsonl", "-o", f"{store.url}/out.jsonl"]) == 0
        got = [json.loads(s) for s in store.put.decode().splitlines()]
        assert [g["custom_id"] for g in got] == ["a", "b"] and store.tries == 3
        assert [g["response"]["body"]["usage"]["completion_tokens"] for g in got] == [3, 2]
        assert not list(tmp_path.iterdir())  # the file written for the upload is gone
        store.fail, store.tries = 99, 0
        assert main([*common, "-i", f"{store.url}/in.jsonl", "-o", f"{store.url}/out.jsonl"]) == 2
        assert "the upload failed 5 times, last with HTTP 500" in capsys.readouterr().err
        assert main([*common, "-i", f"{store.url}/missing.jsonl", "-o", str(tmp_path / "o.jsonl")]) == 2
        assert "missing.jsonl: GET answered HTTP 404" in capsys.readouterr().err
    finally:
        store.server.shutdown()


def test_a_batch_file_from_a_url_splits_at_newlines_alone_and_skips_its_bom(monkeypatch):
    """JSON strings may hold U+2028 raw (json.dumps(ensure_ascii=False) writes it so), which str.splitlines breaks
    at: a file fetched from a URL (or uploaded to the server) split there, and its BOM was read as text; a local
    file never was."""
    import httpx

    from toolkit.serve import run_batch

    row = chat("a", "one\u2028two")
    data = b"\xef\xbb\xbf" + json.dumps(row, ensure_ascii=False).encode() + b"\n"
    monkeypatch.setattr(httpx, "get", lambda *a, **k: type("R", (), {"status_code": 200, "content": data,
                                                                    "text": data.decode("utf-8")})())
    lines = run_batch.read_lines("http://127.0.0.1:1/in.jsonl")
    assert len(lines) == 1 and lines[0].custom_id == "a"
