"""The app and batcher in process (FastAPI's TestClient): an engine step that fails answers its requests with
a 500 error object (a stream ends with the error event and [DONE]) and the server keeps serving; request errors
name what the client sent."""
import json

import pytest
from fastapi.testclient import TestClient

from toolkit.data.tokenizer import load_tokenizer
from toolkit.infer.engine import Engine
from toolkit.infer.loading import load_target, stop_ids
from toolkit.serve.app import Served, build_app
from toolkit.serve.batcher import Batcher
from toolkit.serve.gate import Gate
from toolkit.serve.metrics import ServerMetrics

ASK = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "temperature": 0}


@pytest.fixture
def app(tiny_target, in_process_app):
    with in_process_app(tiny_target) as served:
        yield served


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


def test_request_errors_name_what_the_client_sent(app):
    """JSON nested too deep for the parser was a bare 500 (no error object); a chat request over the context
    with max_completion_tokens (OpenAI's newer name) was told about max_tokens, a field it never sent."""
    asgi, _ = app
    with TestClient(asgi) as client:
        r = client.post("/v1/chat/completions", content=b"[" * 50000, headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "json_invalid", r.text
        # a \\ud800 escape decodes to no Unicode: once a 500 from the tokenizer, now the client's 400
        body = json.dumps(ASK).replace('"content": "', '"content": "\\ud800', 1).encode()
        r = client.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400 and "unpaired surrogate escape" in r.json()["error"]["message"], r.text
        r = client.post("/v1/chat/completions", json={**ASK, "max_tokens": None, "max_completion_tokens": 500})
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == "max_completion_tokens", r.text
        assert err["message"].startswith("max_completion_tokens (500)") and "context of 128" in err["message"]
        r = client.post("/v1/chat/completions", json={**ASK, "max_tokens": 500})
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
        assert client.post("/v1/chat/completions", json=ASK).status_code == 200


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


def test_a_slow_reader_holds_one_merged_update_not_one_per_step(tiny_target):
    """The engine does not wait for a response: a client that stays connected but reads nothing falls behind
    while its sequence generates on. What it has not taken is one pending update (every step's tokens merged,
    in order), not an entry per step that grows with the generation (60 here)."""
    import asyncio

    from toolkit.infer.sampling import SamplingParams
    from toolkit.infer.sequence import Sequence
    from toolkit.serve.batcher import Mailbox, Update

    tok = load_tokenizer(model=str(tiny_target))
    batcher = Batcher(Engine(load_target(tiny_target), max_len=128, max_batch=2), ServerMetrics(), log_every=0)

    async def no_reader():
        req = batcher.submit(Sequence(tok("Hello").input_ids, SamplingParams(max_new_tokens=60)))
        while not req.seq.done:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # the posts the engine thread made run on this loop
        return req

    batcher.start()
    try:
        req = asyncio.run(no_reader())
    finally:
        batcher.stop()
    assert req.updates.qsize() == 1, f"{req.updates.qsize()} updates wait for a reader that lags 60 steps"
    update = req.updates.get_nowait()
    assert update.tokens == req.seq.result.tokens and len(update.tokens) == 60 and update.done

    box = Mailbox()  # an engine failure replaces what was pending: the reply is an error, its tokens moot
    box.put(Update([1, 2]))
    box.put(Update([], True, "boom"))
    box.put(Update([3], True))
    assert box.qsize() == 1 and box.get_nowait().error == "boom" and box.qsize() == 0


def test_the_token_prefill_chose_goes_out_before_the_next_step(tiny_target, monkeypatch):
    """Prefill picks each admitted sequence's first token; it waited for the next (speculative) step before it was
    published, so time to first token read a whole step later than vLLM's. It is published at admission now."""
    import asyncio

    from toolkit.infer.sampling import SamplingParams
    from toolkit.infer.sequence import Sequence

    tok = load_tokenizer(model=str(tiny_target))
    engine = Engine(load_target(tiny_target), max_len=128, max_batch=2)
    batcher = Batcher(engine, ServerMetrics(), log_every=0)
    real_step, sent_at_step = engine.step, []

    def step(speculate=True):
        sent_at_step.append([r.sent for r in batcher.active])
        return real_step(speculate)
    monkeypatch.setattr(engine, "step", step)

    async def ask():
        req = batcher.submit(Sequence(tok("Hello").input_ids, SamplingParams(max_new_tokens=5)))
        while not req.seq.done:
            await asyncio.sleep(0.01)
        return req

    batcher.start()
    try:
        req = asyncio.run(ask())
    finally:
        batcher.stop()
    assert sent_at_step[0] == [1] and req.sent == 5


def test_the_kv_usage_gauge_follows_the_running_sequences(tiny_target):
    """vllm:kv_cache_usage_perc / sglang:token_usage: the share of the batch's cache slots the running sequences
    fill, set after every step; 0 once they are done."""
    import asyncio

    from toolkit.infer.sampling import SamplingParams
    from toolkit.infer.sequence import Sequence

    tok = load_tokenizer(model=str(tiny_target))
    metrics, seen = ServerMetrics(), []
    batcher = Batcher(Engine(load_target(tiny_target), max_len=128, max_batch=2), metrics, log_every=0)
    record = metrics.kv_usage.set
    metrics.kv_usage.set = lambda value: (seen.append((value, [s.prefix for s in batcher.engine.running])),
                                          record(value))

    async def ask():
        req = batcher.submit(Sequence(tok("Hello there").input_ids, SamplingParams(max_new_tokens=20)))
        while not req.seq.done:
            await asyncio.sleep(0.01)

    batcher.start()
    try:
        asyncio.run(ask())
    finally:
        batcher.stop()
    assert all(value == sum(prefixes) / (2 * 128) for value, prefixes in seen)  # the running rows' fill
    assert max(v for v, _ in seen) > 0 and seen[-1][0] == 0
    assert metrics.registry.get_sample_value("vllm:kv_cache_usage_perc", {"model_name": "toolkit", "engine": "0"}) == 0


class HidingTokenizer:
    """The tiny target's tokenizer with one ordinary token it generates treated as special: text decoded with
    skip_special_tokens drops it, as it drops a special token (a chat or tool marker) a model emits mid-reply."""

    def __init__(self, tok, hidden: int):
        self.tok, self.hidden = tok, hidden

    def decode(self, ids, skip_special_tokens=False, **kw):
        if skip_special_tokens:
            ids = [i for i in ids if i != self.hidden]
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens, **kw)

    def __getattr__(self, name):
        return getattr(self.tok, name)


@pytest.fixture
def split_stop(tiny_target, monkeypatch):
    """An app whose greedy reply holds a stop string only once a 'special' token inside it is skipped: the text
    the client gets shows the stop, the text with special tokens (what StopStrings alone searched) never does.
    Yields the client, the request body, the expected (text, completion tokens) and the served sequences."""
    from toolkit.infer.sampling import SamplingParams

    tok = load_tokenizer(model=str(tiny_target))
    engine = Engine(load_target(tiny_target), max_len=512, max_batch=2)
    prompt = tok("The three primary colors are").input_ids
    toks = engine.generate(prompt, SamplingParams(max_new_tokens=200), stop_ids(tok)).tokens
    hiding = HidingTokenizer(tok, toks[4])
    stop = (tok.decode(toks[3:4]) + tok.decode(toks[5:6])).strip()
    shown = hiding.decode(toks, skip_special_tokens=True)
    assert len(toks) == 200 and stop in shown and stop not in tok.decode(toks)  # the case this fixture is for
    upto = next(n for n in range(1, len(toks) + 1) if stop in hiding.decode(toks[:n], skip_special_tokens=True))
    metrics = ServerMetrics()
    batcher = Batcher(engine, metrics, max_queue=4, log_every=0)
    seqs, submit = [], batcher.submit
    monkeypatch.setattr(batcher, "submit", lambda seq: (seqs.append(seq), submit(seq))[1])
    batcher.start()
    asgi = Gate(build_app(Served("tiny", hiding, frozenset(stop_ids(tok)), batcher)), 1 << 16, metrics)
    body = {"prompt": prompt, "max_tokens": 200, "temperature": 0, "stop": [stop]}
    with TestClient(asgi) as client:
        yield client, body, (shown[:shown.index(stop)], upto), seqs
    batcher.stop()


def replies(client, body) -> list[tuple[str, str, dict]]:
    """(text, finish_reason, usage) of the request non-streamed, then streamed with include_usage."""
    r = client.post("/v1/completions", json=body).json()
    out = [(r["choices"][0]["text"], r["choices"][0]["finish_reason"], r["usage"])]
    with client.stream("POST", "/v1/completions", json={**body, "stream": True,
                                                        "stream_options": {"include_usage": True}}) as s:
        chunks = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    reasons = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    return out + [("".join(c["choices"][0]["text"] for c in chunks if c["choices"]), reasons[-1], chunks[-1]["usage"])]


def test_a_stop_string_split_by_a_special_token_stops_the_engine_there(split_stop):
    """The reply was cut at the stop string, but the engine (matching with special tokens) generated on to
    max_tokens: the non-streamed usage counted all 200 tokens, the streamed one whatever the engine thread had
    reached when it was read. Now the engine stops at the token that completes the stop string, as it stops at
    one it finds itself, and usage counts the tokens through it (as vLLM counts them)."""
    client, body, (text, upto), seqs = split_stop
    for got, seq in zip(replies(client, body), seqs):
        assert got[:2] == (text, "stop")
        assert got[2]["completion_tokens"] == upto and got[2]["total_tokens"] == len(body["prompt"]) + upto
        assert len(seq.result.tokens) == upto and seq.result.finish == "stop"  # nothing generated past it


def test_a_stop_the_engine_misses_still_gives_final_usage_through_it(split_stop, monkeypatch):
    """Should the engine miss a stop string the reply shows (here: its old check, text with special tokens),
    the sequence is cancelled and the reply waits for the engine to let it go, then counts the tokens through
    the stop: never the engine's count while its thread still adds to it."""
    import time

    from toolkit.infer.sequence import StopStrings
    from toolkit.serve.text import TextStream

    class BusyLoop(TextStream):  # the event loop is busy elsewhere (other streams) just as the stop shows
        def update(self, tokens, done):
            delta = super().update(tokens, done)
            if self.stopped:
                time.sleep(0.05)  # the engine thread runs on meanwhile: usage read now counted its new tokens
            return delta

    monkeypatch.setattr("toolkit.serve.sequences.ClientStops",
                        lambda tok, strings, min_tokens, keep: StopStrings(tok, strings))
    monkeypatch.setattr("toolkit.serve.choice.TextStream", BusyLoop)
    client, body, (text, upto), seqs = split_stop
    for got, seq in zip(replies(client, body), seqs):
        assert got[:2] == (text, "stop") and got[2]["completion_tokens"] == upto
        assert seq.done and upto <= len(seq.result.tokens) < 200  # cancelled soon after, not run to max_tokens
        assert got[2]["speculative"]["verify_steps"] == upto - 1  # plain decoding: one step per later token
    assert client.get("/health").json()["running"] == 0
    # a stop found in the text is a stop, as vLLM counts its detokenizer's: not an abort (the client stayed)
    reasons = {line.split('finished_reason="')[1].split('"')[0]: float(line.split()[-1])
               for line in client.get("/metrics").text.splitlines() if line.startswith("vllm:request_success_total{")}
    assert reasons.get("stop") == 2 and not reasons.get("abort")


def test_usage_through_a_stop_keeps_the_steps_that_emitted_those_tokens():
    from toolkit.infer.sequence import Result
    from toolkit.serve.choice import through

    r = Result(list(range(9)), verify_steps=3, accepted=[2, 0, 3], from_lookup=4)  # 1 + 3 + 1 + 4 tokens
    cut = through(r, 6)
    assert cut.tokens == list(range(6)) and cut.accepted == [2, 0, 0] and cut.verify_steps == 3
    assert cut.from_lookup == 2 and len(cut.tokens) - 1 == sum(cut.accepted) + len(cut.accepted)
    assert through(r, 1).accepted == [] and through(r, 9) == r
