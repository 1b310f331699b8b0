"""OpenAI's Files and Batch APIs on the server, through the openai client: a batch file uploaded, run in the
background through the server's own endpoints, its output and error files in the input's order; validation
failures, cancellation (rows freed, the answers so far kept) and the files routes."""
from __future__ import annotations

import json
import time

import pytest
from fastapi.testclient import TestClient
from openai import OpenAI

ENDPOINT = "/v1/chat/completions"


def line(cid: str, text: str, url: str = ENDPOINT, **extra) -> dict:
    return {"custom_id": cid, "method": "POST", "url": url,
            "body": {"messages": [{"role": "user", "content": text}], "max_tokens": 6, "temperature": 0, **extra}}


def jsonl(rows) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


@pytest.fixture(scope="module")
def server(tiny_target, in_process_app):
    with in_process_app(tiny_target) as (app, engine), TestClient(app) as http:
        yield OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=http), http, engine


def wait(client, bid: str, until=("completed", "failed", "cancelled"), seconds: float = 120):
    deadline = time.time() + seconds
    while (batch := client.batches.retrieve(bid)).status not in until:
        assert time.time() < deadline, batch
        time.sleep(0.05)
    return batch


def test_a_batch_runs_and_writes_output_and_error_files_in_order(server):
    client, http, _ = server
    rows = [line("a", "Tell me a story", max_tokens=10), line("bad", "x", temperature=-1), line("b", "Hi"),
            line("other", "x", model="gpt-4o"), line("c", "Count to three", max_tokens=3)]
    up = client.files.create(file=("in.jsonl", jsonl(rows)), purpose="batch")
    assert up.purpose == "batch" and up.bytes == len(jsonl(rows)) and up.filename == "in.jsonl"
    batch = client.batches.create(input_file_id=up.id, endpoint=ENDPOINT, completion_window="24h",
                                  metadata={"run": "t1"})
    assert batch.status == "in_progress" and batch.metadata == {"run": "t1"} and batch.request_counts.total == 5
    batch = wait(client, batch.id)
    assert batch.status == "completed" and batch.completed_at >= batch.in_progress_at
    assert (batch.request_counts.completed, batch.request_counts.failed) == (3, 2)
    out = [json.loads(s) for s in client.files.content(batch.output_file_id).text.splitlines()]
    err = [json.loads(s) for s in client.files.content(batch.error_file_id).text.splitlines()]
    assert [o["custom_id"] for o in out] == ["a", "b", "c"] and [e["custom_id"] for e in err] == ["bad", "other"]
    assert [e["response"]["status_code"] for e in err] == [400, 404]
    direct = http.post(ENDPOINT, json=rows[0]["body"]).json()  # the same request straight to the endpoint
    assert out[0]["response"]["body"]["choices"][0]["message"] == direct["choices"][0]["message"]
    tokens = sum(o["response"]["body"]["usage"]["completion_tokens"] for o in out)
    assert tokens == 10 + 6 + 3 and batch.usage.output_tokens == tokens
    spec = batch.model_extra["speculative"]  # a target without a draft: one token per step after prefill's
    assert spec == {"verify_steps": tokens - 3, "accepted_tokens": 0, "tau": 1.0}
    assert client.files.retrieve(batch.output_file_id).purpose == "batch_output"
    assert batch.id in [b.id for b in client.batches.list()]


def test_a_file_that_is_not_a_batch_file_fails_the_batch_naming_the_line(server):
    client, _, _ = server
    up = client.files.create(file=("in.jsonl", jsonl([line("a", "x"), line("b", "y", url="/v1/completions")])),
                             purpose="batch")
    batch = client.batches.create(input_file_id=up.id, endpoint=ENDPOINT, completion_window="24h")
    assert batch.status == "failed" and batch.failed_at is not None and batch.output_file_id is None
    assert "in.jsonl line 2: url '/v1/completions' is not the batch's endpoint" in batch.errors.data[0].message
    bad = client.files.create(file=("x.jsonl", b"{not json\n"), purpose="batch")
    assert "line 1: not JSON" in client.batches.create(input_file_id=bad.id, endpoint=ENDPOINT,
                                                       completion_window="24h").errors.data[0].message


def test_batch_create_refuses_unknown_files_endpoints_and_windows(server):
    _, http, _ = server
    up = http.post("/v1/files", files={"file": ("a.jsonl", jsonl([line("a", "x")]))}, data={"purpose": "batch"}).json()
    r = http.post("/v1/batches", json={"input_file_id": "file-nope", "endpoint": ENDPOINT, "completion_window": "24h"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "input_file_id"
    r = http.post("/v1/batches", json={"input_file_id": up["id"], "endpoint": "/v1/embeddings"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "endpoint"
    r = http.post("/v1/batches", json={"input_file_id": up["id"], "endpoint": ENDPOINT, "completion_window": "1h"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "completion_window"


def test_cancel_stops_the_batch_frees_its_rows_and_keeps_the_answers_so_far(server):
    client, http, engine = server
    rows = [line(f"q{i}", f"Story number {i}", max_tokens=60) for i in range(12)]
    up = client.files.create(file=("long.jsonl", jsonl(rows)), purpose="batch")
    batch = client.batches.create(input_file_id=up.id, endpoint=ENDPOINT, completion_window="24h")
    deadline = time.time() + 60
    while not engine.running:  # the first requests are running
        assert time.time() < deadline
        time.sleep(0.01)
    assert client.batches.cancel(batch.id).status in ("cancelling", "cancelled")
    batch = wait(client, batch.id)
    assert batch.status == "cancelled" and batch.cancelled_at >= batch.cancelling_at
    assert batch.request_counts.completed < 12
    deadline = time.time() + 30
    while engine.running:  # the cancelled requests' sequences leave the batch
        assert time.time() < deadline
        time.sleep(0.05)
    if batch.output_file_id:
        done = [json.loads(s)["custom_id"] for s in client.files.content(batch.output_file_id).text.splitlines()]
        assert len(done) == batch.request_counts.completed
    r = http.post(f"/v1/batches/{batch.id}/cancel")
    assert r.status_code == 409 and "is cancelled" in r.json()["error"]["message"]
    assert http.post(ENDPOINT, json=rows[0]["body"]).status_code == 200  # the server goes on serving


def test_files_routes_list_get_delete_and_refuse_bad_uploads(server):
    client, http, _ = server
    a = client.files.create(file=("a.jsonl", b"{}\n"), purpose="batch")
    b = client.files.create(file=("b.txt", b"notes"), purpose="user_data")
    listed = [f.id for f in client.files.list(purpose="user_data")]
    assert b.id in listed and a.id not in listed
    page = http.get("/v1/files", params={"limit": 1, "order": "desc"}).json()
    assert page["data"][0]["id"] == b.id and page["has_more"] is True
    assert client.files.retrieve(a.id).filename == "a.jsonl"
    assert client.files.content(b.id).content == b"notes"
    assert client.files.delete(a.id).deleted is True
    r = http.get(f"/v1/files/{a.id}")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = http.post("/v1/files", files={"file": ("a.jsonl", b"{}")}, data={"purpose": "fun"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "purpose"
    r = http.post("/v1/files", json={"purpose": "batch"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "file"


def message(cid: str, text: str, **extra) -> dict:
    return {"custom_id": cid, "params": {"model": "tiny", "max_tokens": 5, "temperature": 0,
                                         "messages": [{"role": "user", "content": text}], **extra}}


@pytest.fixture(scope="module")
def anthropic_client(server):
    import anthropic

    return anthropic.Anthropic(base_url="http://testserver", api_key="unused", http_client=server[1])


def wait_ended(client, bid: str, seconds: float = 120):
    deadline = time.time() + seconds
    while (batch := client.messages.batches.retrieve(bid)).processing_status != "ended":
        assert time.time() < deadline, batch
        time.sleep(0.05)
    return batch


def test_message_batches_through_the_anthropic_client(anthropic_client, server):
    client, http = anthropic_client, server[1]
    batch = client.messages.batches.create(requests=[message("a", "Hello there", max_tokens=7),
                                                     message("no-max", "x", max_tokens=None),
                                                     message("b", "Hi")])
    assert batch.id.startswith("msgbatch_") and batch.processing_status == "in_progress"
    batch = wait_ended(client, batch.id)
    assert (batch.request_counts.succeeded, batch.request_counts.errored, batch.request_counts.canceled) == (2, 1, 0)
    assert batch.ended_at is not None and batch.results_url.endswith(f"/v1/messages/batches/{batch.id}/results")
    got = list(client.messages.batches.results(batch.id))
    assert [r.custom_id for r in got] == ["a", "no-max", "b"]
    assert [r.result.type for r in got] == ["succeeded", "errored", "succeeded"]
    direct = http.post("/v1/messages", json=message("a", "Hello there", max_tokens=7)["params"]).json()
    assert got[0].result.message.content[0].text == direct["content"][0]["text"]  # greedy: the same text
    assert got[0].result.message.usage.output_tokens == 7
    assert "max_tokens" in got[1].result.error.error.message
    assert batch.id in [b.id for b in client.messages.batches.list()]
    assert client.messages.batches.delete(batch.id).type == "message_batch_deleted"
    r = http.get(f"/v1/messages/batches/{batch.id}")
    assert r.status_code == 404 and r.json()["type"] == "error"


def test_message_batches_refuse_bad_requests_in_anthropic_shape(server):
    http = server[1]
    for body, text in (({"requests": []}, "requests: give a non-empty list"),
                       ({"requests": [message("a b", "x")]}, "requests.0: custom_id 'a b'"),
                       ({"requests": [message("a", "x"), message("a", "y")]}, "requests.1: custom_id 'a' repeats"),
                       ({"requests": [message("a", "x", stream=True)]}, "requests.0: stream is true")):
        r = http.post("/v1/messages/batches", json=body)
        assert r.status_code == 400 and r.json()["type"] == "error" and text in r.json()["error"]["message"], r.json()


def test_a_cancelled_message_batch_lists_its_unanswered_requests_as_canceled(anthropic_client, server):
    client, engine = anthropic_client, server[2]
    batch = client.messages.batches.create(requests=[message(f"q{i}", f"Story {i}", max_tokens=60)
                                                     for i in range(12)])
    deadline = time.time() + 60
    while not engine.running:
        assert time.time() < deadline
        time.sleep(0.01)
    r = server[1].get(f"/v1/messages/batches/{batch.id}/results")
    assert r.status_code == 400 and "still in_progress" in r.json()["error"]["message"]
    assert client.messages.batches.cancel(batch.id).processing_status in ("canceling", "ended")
    batch = wait_ended(client, batch.id)
    counts = batch.request_counts
    assert counts.canceled > 0 and counts.succeeded + counts.errored + counts.canceled == 12
    kinds = [r.result.type for r in client.messages.batches.results(batch.id)]
    assert kinds.count("canceled") == counts.canceled and len(kinds) == 12
