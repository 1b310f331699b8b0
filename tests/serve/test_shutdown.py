"""Stopping the server (SIGTERM / Ctrl-C) as vLLM's --shutdown-timeout does: new requests are refused, those in
flight get the timeout to finish, and any still running then end with a 503 that says why (a stream: an error
event, then [DONE]). uvicorn's own timeout cancelled them: a plain-text 500, a stream cut mid-way, tracebacks."""
import asyncio
import json
import signal
import threading
import time

import httpx
import pytest

from toolkit.infer.engine import Engine
from toolkit.infer.loading import load_target
from toolkit.infer.sampling import SamplingParams
from toolkit.infer.sequence import Sequence
from toolkit.serve.api_error import ApiError
from toolkit.serve.batcher import Batcher
from toolkit.serve.metrics import ServerMetrics

LONG = {"max_tokens": 900, "ignore_eos": True, "temperature": 0}


def test_requests_in_flight_end_with_a_503_after_the_shutdown_timeout(serve, tiny_target):
    with serve(str(tiny_target), "--no-speculation", "--max-seq-len", "4096", "--shutdown-timeout", "0.3") as (base, proc):
        got = {}

        def stream():
            body = {"messages": [{"role": "user", "content": "Hi"}], "stream": True, **LONG}
            with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=60) as r:
                got["stream"] = [line for line in r.iter_lines() if line]

        def whole():
            r = httpx.post(f"{base}/v1/completions", json={"prompt": "Hi", **LONG}, timeout=60)
            got["whole"] = (r.status_code, r.json())

        threads = [threading.Thread(target=f) for f in (stream, whole)]
        for t in threads:
            t.start()
        deadline = time.time() + 30
        while time.time() < deadline:  # both in: one running, the other running or queued (one row on a CPU)
            health = httpx.get(f"{base}/health").json()
            if health["running"] >= 1 and health["running"] + health["waiting"] >= 2:
                break
            time.sleep(0.02)
        start = time.time()
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(timeout=60)
        assert proc.wait(timeout=60) == 0
        took = time.time() - start
        err = proc.stderr.read()
    status, body = got["whole"]
    assert status == 503 and body["error"]["code"] == "server_shutting_down", body
    assert "--shutdown-timeout 0.3 s" in body["error"]["message"]
    assert got["stream"][-1] == "data: [DONE]"
    last = json.loads(got["stream"][-2].removeprefix("data: "))
    assert last["error"]["code"] == "server_shutting_down", last
    assert len(got["stream"]) > 3  # tokens flowed before the signal ended them
    assert 0.3 <= took < 20 and "Traceback" not in err, err[-3000:]


def test_a_draining_batcher_refuses_new_requests_and_aborts_the_rest(tiny_target):
    metrics = ServerMetrics()
    batcher = Batcher(Engine(load_target(tiny_target), max_len=128, max_batch=1), metrics, log_every=0)

    async def scenario():
        running = batcher.submit(Sequence([1, 2, 3], SamplingParams(max_new_tokens=100)))
        queued = batcher.submit(Sequence([1, 2, 3], SamplingParams(max_new_tokens=100)))
        batcher.drain()
        with pytest.raises(ApiError) as refused:
            batcher.submit(Sequence([1, 2, 3], SamplingParams(max_new_tokens=5)))
        batcher.abort_all("stopping")
        ends = []
        for req in (running, queued):
            while not (update := await req.updates.get()).done:
                pass
            ends.append((update.status, update.error))
        return refused.value, ends

    batcher.start()
    try:
        refused, ends = asyncio.run(scenario())
    finally:
        batcher.stop()
    assert refused.status == 503 and refused.code == "server_shutting_down"
    assert ends == [(503, "stopping")] * 2
    assert not batcher.engine.running and not batcher.waiting
