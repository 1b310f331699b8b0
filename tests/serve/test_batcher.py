"""The app and batcher in process (FastAPI's TestClient): an engine step that fails answers its requests with
a 500 error object (a stream ends with the error event and [DONE]) and the server keeps serving."""
import json

import pytest
from fastapi.testclient import TestClient

from toolkit.data.chat import load_tokenizer
from toolkit.infer.engine import Engine
from toolkit.infer.loading import load_target, stop_ids
from toolkit.serve.app import Served, build_app
from toolkit.serve.batcher import Batcher
from toolkit.serve.gate import Gate
from toolkit.serve.metrics import ServerMetrics

ASK = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "temperature": 0}


@pytest.fixture
def app(tiny_target):
    tok = load_tokenizer(model=str(tiny_target))
    engine = Engine(load_target(tiny_target), max_len=128, max_batch=2)
    metrics = ServerMetrics()
    batcher = Batcher(engine, metrics, max_queue=4, log_every=0)
    batcher.start()
    yield Gate(build_app(Served("tiny", tok, frozenset(stop_ids(tok)), batcher)), 1 << 16, metrics), engine
    batcher.stop()


def test_a_failing_engine_step_gives_500_and_the_server_keeps_serving(app, monkeypatch):
    asgi, engine = app
    real_step, calls = engine.step, []

    def flaky_step(speculate=True):
        calls.append(1)
        if len(calls) <= 2:
            raise RuntimeError("simulated kernel failure")
        return real_step(speculate)

    monkeypatch.setattr(engine, "step", flaky_step)
    with TestClient(asgi) as client:
        r = client.post("/v1/chat/completions", json=ASK)
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
        with client.stream("POST", "/v1/chat/completions", json={**ASK, "stream": True}) as s:
            events = [line.removeprefix("data: ") for line in s.iter_lines() if line.startswith("data: ")]
        assert "error" in json.loads(events[-2]) and events[-1] == "[DONE]"
        r = client.post("/v1/chat/completions", json=ASK)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 6
        assert engine.running == [] and client.get("/health").json()["status"] == "ok"
        assert 'toolkit_requests_total{code="500",endpoint="/v1/chat/completions"} 1.0' in client.get("/metrics").text


def test_a_failing_prefill_answers_the_requests_it_was_admitting(app, monkeypatch):
    """engine.admit raising (a prefill's kernel, say) must answer the requests being admitted with a 500, not
    leave their clients waiting for ever; the next request is served."""
    import threading

    asgi, engine = app
    real_admit, calls = engine.admit, []

    def flaky_admit(seqs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("simulated prefill failure")
        return real_admit(seqs)

    monkeypatch.setattr(engine, "admit", flaky_admit)
    client = TestClient(asgi)  # no lifespan context: a request left waiting must not hang the test's exit
    got = []
    t = threading.Thread(target=lambda: got.append(client.post("/v1/chat/completions", json=ASK)), daemon=True)
    t.start()
    t.join(timeout=60)
    assert got, "the request admitted when the prefill failed was never answered"
    assert got[0].status_code == 500 and got[0].json()["error"]["type"] == "server_error"
    r = client.post("/v1/chat/completions", json=ASK)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 6
