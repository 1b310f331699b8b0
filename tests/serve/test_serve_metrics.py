"""/metrics as vLLM keeps it: every request that ends counted once under its finished_reason (cancelled while
queued too), each reason at 0 from the start, the per-position spec series one per draft position the server can
accept (none without speculation), and --speculative-disable-by-batch-size read and checked as vLLM's."""
import asyncio

import pytest
from fastapi.testclient import TestClient

from toolkit.cli import build_parser
from toolkit.data.tokenizer import load_tokenizer
from toolkit.infer.engine import Engine
from toolkit.infer.loading import load_target
from toolkit.infer.sampling import SamplingParams
from toolkit.infer.sequence import Sequence
from toolkit.serve.batcher import Batcher, Request
from toolkit.serve.engine_args import build, check
from toolkit.serve.metrics import ServerMetrics

VL = {"model_name": "toolkit", "engine": "0"}


def finished(metrics: ServerMetrics) -> dict:
    """request_success_total by finished_reason (None: no such series), and the e2e latency count."""
    get = metrics.registry.get_sample_value
    counts = {reason: get("vllm:request_success_total", {**VL, "finished_reason": reason})
              for reason in ("stop", "length", "abort")}
    return {**counts, "e2e": get("vllm:e2e_request_latency_seconds_count", VL)}


def test_every_finished_reason_reads_0_from_the_start():
    """vLLM creates each finished_reason at startup: rate() over a fresh server reads 0, not no data."""
    metrics = ServerMetrics()
    assert finished(metrics) == {"stop": 0, "length": 0, "abort": 0, "e2e": 0}
    text = metrics.render().decode()
    for reason in ("stop", "length", "abort"):
        assert f'finished_reason="{reason}"' in text


def test_a_request_cancelled_while_queued_counts_as_finished_once(tiny_target):
    """A request cancelled before a row freed for it left the queue uncounted (a running one's cancel was
    counted): request_success_total{abort} and the e2e histogram missed it."""
    tok = load_tokenizer(model=str(tiny_target))
    metrics = ServerMetrics()
    batcher = Batcher(Engine(load_target(tiny_target), max_len=128, max_batch=1), metrics, log_every=0)
    prompt = tok("Hello").input_ids

    async def scenario():
        running = batcher.submit(Sequence(prompt, SamplingParams(max_new_tokens=100)))
        while not running.sent:  # it holds the only row
            await asyncio.sleep(0.005)
        queued = batcher.submit(Sequence(prompt, SamplingParams(max_new_tokens=5)))
        batcher.cancel(queued)
        while not (await queued.updates.get()).done:
            pass
        after_queued = finished(metrics)
        batcher.cancel(running)
        while not (await running.updates.get()).done:
            pass
        await asyncio.sleep(0.1)  # a second count, were there one, would land by now
        return queued, after_queued, finished(metrics)

    batcher.start()
    try:
        queued, after_queued, after_both = asyncio.run(scenario())
    finally:
        batcher.stop()
    assert queued.seq.result.tokens == []  # never admitted
    assert after_queued == {"stop": 0, "length": 0, "abort": 1, "e2e": 1}
    assert after_both == {"stop": 0, "length": 0, "abort": 2, "e2e": 2}
    assert metrics.registry.get_sample_value("vllm:num_requests_waiting", VL) == 0


def test_a_request_refused_for_a_full_queue_queues_none_of_its_choices_and_counts_nothing(tiny_target):
    """n choices go into the queue together or not at all: with room for one of two, the first was queued, then
    cancelled by the 429, and counted as a finished, aborted request."""
    from toolkit.serve.api_error import ApiError

    tok = load_tokenizer(model=str(tiny_target))
    metrics = ServerMetrics()
    batcher = Batcher(Engine(load_target(tiny_target), max_len=128, max_batch=1), metrics, max_queue=1, log_every=0)
    prompt = tok("Hello").input_ids

    async def scenario():
        with pytest.raises(ApiError) as err:
            batcher.submit_all([Sequence(prompt, SamplingParams(max_new_tokens=5)) for _ in range(2)])
        return err.value

    err = asyncio.run(scenario())  # the engine thread is not started: nothing leaves the queue meanwhile
    assert err.status == 429 and not batcher.waiting
    assert finished(metrics) == {"stop": 0, "length": 0, "abort": 0, "e2e": 0}


def test_requests_an_engine_step_failed_count_as_finished(tiny_target, monkeypatch):
    tok = load_tokenizer(model=str(tiny_target))
    metrics = ServerMetrics()
    engine = Engine(load_target(tiny_target), max_len=128, max_batch=2)
    batcher = Batcher(engine, metrics, log_every=0)

    def broken(speculate=True):
        raise RuntimeError("a bug")

    monkeypatch.setattr(engine, "step", broken)

    async def scenario():
        reqs = batcher.submit_all([Sequence(tok("Hello").input_ids, SamplingParams(max_new_tokens=5))
                                   for _ in range(2)])
        for req in reqs:
            while not (update := await req.updates.get()).done:
                pass
            assert "internal error" in update.error
        await asyncio.sleep(0.1)

    batcher.start()
    try:
        asyncio.run(scenario())
    finally:
        batcher.stop()
    assert finished(metrics) == {"stop": 0, "length": 0, "abort": 2, "e2e": 2}


def test_drafting_stops_at_the_batch_size_threshold_as_vllms(tiny_target, monkeypatch):
    """vLLM drops drafting once running_queue_size >= disable_by_batch_size; the batcher waited for one more."""
    tok = load_tokenizer(model=str(tiny_target))
    engine = Engine(load_target(tiny_target), max_len=128, max_batch=3)
    batcher = Batcher(engine, ServerMetrics(), log_every=0, disable_by_batch_size=2)
    seen, step = [], engine.step
    monkeypatch.setattr(engine, "step", lambda speculate=True: (seen.append((len(engine.running), speculate)),
                                                                  step(speculate))[1])
    loop = asyncio.new_event_loop()  # the updates' loop (not run: the engine steps here, on this thread)
    try:
        for _ in range(3):
            batcher._advance([Request(Sequence(tok("Hello").input_ids, SamplingParams(max_new_tokens=20)), loop)])
    finally:
        loop.close()
    assert seen == [(1, True), (2, False), (3, False)]


def parsed(*argv: str):
    args = build_parser().parse_args(["serve", "--model", "m", *argv])
    return args, check(args, "serve")


@pytest.mark.parametrize("argv", [["--speculative-disable-by-batch-size", "1"],
                                  ["--speculative-disable-by-batch-size", "0"],
                                  ["--speculative-config", '{"model": "d", "num_speculative_tokens": 3, '
                                                           '"disable_by_batch_size": 1}']], ids=["1", "0", "config"])
def test_a_batch_size_threshold_under_2_is_refused_as_vllm_refuses_it(argv):
    with pytest.raises(ValueError) as refused:
        parsed("--draft", "d", *argv)
    message = str(refused.value)
    assert message.startswith("--speculative-disable-by-batch-size ") and ">= 2" in message
    assert parsed("--draft", "d", "--speculative-disable-by-batch-size", "2")[0].speculative_disable_by_batch_size == 2


@pytest.mark.parametrize("argv, positions", [
    (["--no-speculation", "--lookup", "3"], 3),  # lookup alone: its length, not the tree's default 5 steps
    (["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "4"], 3),  # SGLang's line for it
    (["--no-speculation"], None),  # plain decoding: no spec_decode series at all, as vLLM without a spec config
], ids=["lookup", "sglang-ngram", "no-speculation"])
def test_per_position_series_cover_the_positions_usage_reports(tiny_target, argv, positions):
    """The metrics' positions came from max(tree steps, --lookup): the tree keeps its default 5 steps without a
    head, so lookup alone of 3 exported positions 0-4, and --no-speculation exported spec series at all."""
    from toolkit.serve.app import build_app

    args = build_parser().parse_args(["serve", "--model", str(tiny_target), *argv, "--max-seq-len", "128",
                                      "--max-batch-size", "1", "--prefix-cache-rows", "0", "--log-every", "0"])
    stack = build(args, *check(args, "serve"), 4, "serve")
    text = stack.metrics.render().decode()
    if positions is None:
        assert "vllm:spec_decode" not in text
    else:
        assert {line.split('position="')[1].split('"')[0] for line in text.splitlines()
                if line.startswith("vllm:spec_decode_num_accepted_tokens_per_pos_total{")} == \
            {str(k) for k in range(positions)}
    stack.served.batcher.start()
    try:
        with TestClient(build_app(stack.served)) as client:
            usage = client.post("/v1/completions", json={"prompt": "Hi Hi Hi Hi", "max_tokens": 4,
                                                         "temperature": 0}).json()["usage"]
    finally:
        stack.served.batcher.stop()
    assert len(usage["speculative"]["accept_rate_by_position"]) == (positions or 0)  # the same positions
