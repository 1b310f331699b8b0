"""Continuous batching: one thread owns the engine and runs step after step; between steps it releases
cancelled sequences, admits waiting requests into free rows (FIFO) and publishes each request's new tokens
to its mailbox. Requests join and leave the running batch only at step boundaries.

The engine never waits for a response: a client that reads slowly (or not at all) falls behind while its
sequence generates on. Its mailbox then holds one update, the steps it has not taken merged, rather than one
entry per step (which grew with every step until the response caught up or the request ended).
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field

from toolkit.infer.engine import Engine
from toolkit.infer.sequence import Sequence
from toolkit.serve.api_error import ApiError
from toolkit.serve.metrics import ServerMetrics

log = logging.getLogger("toolkit.serve")


@dataclass
class Update:
    tokens: list[int]         # generated since the previous update
    done: bool = False        # the engine is through with the sequence: its counts are final, no update follows
    error: str | None = None  # the engine step failed, or the request could not go on (then nothing else counts)
    status: int = 500         # the error's: 400 where the request's own constraints left no token to generate,
                              # 503 where the server stopped before the request was through (abort_all)
    logprobs: list = field(default_factory=list)  # the new tokens' TokenLogprobs, when the request asked for them


class Mailbox:
    """One request's updates, on the event loop's thread: those the response has not taken yet are merged into
    one pending update, so a reader that lags holds one entry however many steps it is behind."""

    def __init__(self):
        self.pending: Update | None = None
        self.ready = asyncio.Event()

    def put(self, update: Update) -> None:
        if self.pending is None or update.error is not None:  # an error ends the request: it replaces the rest
            self.pending = update
        elif self.pending.error is None:
            self.pending.tokens += update.tokens  # the engine thread made these lists and no longer touches them
            self.pending.logprobs += update.logprobs
            self.pending.done = update.done
        self.ready.set()

    def qsize(self) -> int:
        return int(self.pending is not None)

    def get_nowait(self) -> Update:
        if self.pending is None:
            raise asyncio.QueueEmpty
        update, self.pending = self.pending, None
        return update

    async def get(self) -> Update:
        while self.pending is None:
            self.ready.clear()
            await self.ready.wait()
        return self.get_nowait()


@dataclass(eq=False)
class Request:
    seq: Sequence
    loop: asyncio.AbstractEventLoop
    updates: Mailbox = field(default_factory=Mailbox)
    arrived: float = field(default_factory=time.perf_counter)
    cancelled: bool = False
    reason: str = "abort"  # vLLM's finished_reason once cancelled: abort (the client left), stop (a stop string)
    sent: int = 0  # tokens published so far

    def publish(self, update: Update) -> None:
        """From the engine thread: the merge runs on the loop's thread, which owns the mailbox."""
        try:
            self.loop.call_soon_threadsafe(self.updates.put, update)
        except RuntimeError:  # the loop has closed (the server stops): no response is left to tell
            pass


class Batcher:
    def __init__(self, engine: Engine, metrics: ServerMetrics, max_queue: int = 256, log_every: int = 50,
                 disable_by_batch_size: int | None = None):
        self.engine, self.metrics, self.max_queue, self.log_every = engine, metrics, max_queue, log_every
        self.disable_by_batch_size = disable_by_batch_size  # this many running or more: plain steps (vLLM's >=)
        self.waiting: deque[Request] = deque()
        self.active: list[Request] = []  # admitted, not yet finished
        self.wake = threading.Condition()
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name="toolkit-batcher", daemon=True)
        self.window = {"steps": 0, "seq_steps": 0, "accepted": 0, "tokens": 0, "busy": 0.0, "drafts": 0, "drafted": 0,
                       "at": []}
        self.total_steps = 0
        self.totals = {"seq_steps": 0, "accepted": 0, "tokens": 0, "busy": 0.0}  # since the start
        self.flushing = False  # the prefix cache is to be emptied at the next step boundary (flush())
        self.draining = False  # the server stops: new requests get 503s (drain())
        self.aborting: str | None = None  # every request is to end with this 503 at the next step boundary
        self.step_times: dict[int, deque] = {}  # running sequences -> the last 1,000 engine steps' seconds

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        with self.wake:
            self.stopping = True
            self.wake.notify()
        self.thread.join(timeout=30)

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    def submit(self, seq: Sequence) -> Request:
        """Queue a sequence (called on the event loop); over the queue limit: a 429."""
        return self.submit_all([seq])[0]

    def submit_all(self, seqs: list[Sequence]) -> list[Request]:
        """Queue a request's sequences (its n choices) together or none of them: over the queue limit, a 429 that
        leaves nothing queued (a choice queued and then cancelled counted as a finished, aborted request)."""
        for seq in seqs:
            try:
                self.engine.check(seq.prompt, seq.params)
            except ValueError as e:
                raise ApiError(400, str(e), None, "context_length_exceeded") from None
        loop = asyncio.get_running_loop()
        reqs = [Request(seq, loop) for seq in seqs]
        with self.wake:
            if self.draining:
                raise ApiError(503, "the server is shutting down; send the request to another replica", None,
                               "server_shutting_down", "server_error")
            if len(self.waiting) + len(reqs) > self.max_queue:
                raise ApiError(429, f"server busy: {len(self.waiting)} requests already wait for a batch slot "
                                    f"(--max-queue {self.max_queue}); retry later", None, "queue_full",
                               "rate_limit_error")
            self.waiting.extend(reqs)
            self.metrics.waiting.set(len(self.waiting))
            self.wake.notify()
        return reqs

    def flush(self) -> None:
        """Empty the prefix cache at the next step boundary, on the engine thread (SGLang's /flush_cache); the
        running sequences go on as they were."""
        with self.wake:
            self.flushing = True
            self.wake.notify()

    def drain(self) -> None:
        """The server stops: requests that arrive from now on are refused with a 503; those in flight go on."""
        with self.wake:
            self.draining = True

    def abort_all(self, message: str) -> None:
        """End every queued and running request at the next step boundary with a 503 saying `message` (the server
        stopped before they were through: vLLM's --shutdown-timeout passed), so that each client reads why."""
        with self.wake:
            self.aborting = message
            self.wake.notify()

    def cancel(self, req: Request, reason: str = "abort") -> None:
        """The client went away (or the reply showed a stop string the engine missed: reason "stop"): the sequence
        leaves at the next step boundary, its row is reused, and it counts as finished with the first reason."""
        with self.wake:
            if not req.cancelled:
                req.cancelled, req.reason = True, reason
            self.wake.notify()

    def _run(self) -> None:
        while True:
            with self.wake:
                while not (self.stopping or self.waiting or self.active or self.flushing or self.aborting):
                    self.wake.wait()
                if self.stopping:
                    return
                if self.aborting is not None:
                    for req in self.active:
                        self.engine.release(req.seq)
                    for req in [*self.waiting, *self.active]:
                        self.metrics.finished("abort", time.perf_counter() - req.arrived)
                        req.publish(Update([], True, self.aborting, 503))
                    self.waiting.clear()
                    self.active, self.aborting = [], None
                    self.metrics.waiting.set(0)
                    self.metrics.running.set(len(self.engine.running))
                if self.flushing:
                    if self.engine.prefix_cache is not None:
                        self.engine.prefix_cache.clear()
                    self.flushing = False
                if not (self.waiting or self.active):
                    continue
                for req in [r for r in self.waiting if r.cancelled]:  # never admitted: they finish here
                    self.waiting.remove(req)
                    self.metrics.finished(req.reason, time.perf_counter() - req.arrived)
                    req.publish(Update([], True))
                admit = []
                while self.waiting and len(admit) < self.engine.max_batch - len(self.engine.running):
                    admit.append(self.waiting.popleft())
                self.metrics.waiting.set(len(self.waiting))
            t0 = time.perf_counter()
            try:
                self._advance(admit)
            except Exception:  # a bug must not take the server down: fail the batch, keep serving
                message = traceback.format_exc(limit=4)
                # the requests being admitted too: a failed prefill must not leave their clients waiting
                failed = self.active + [r for r in admit if r not in self.active]
                log.error("engine step failed; failing %d requests\n%s", len(failed), message)
                for req in failed:
                    req.publish(Update([], True, "internal error in the engine step; see the server log"))
                    self.metrics.finished("abort", time.perf_counter() - req.arrived)  # ended all the same
                self.active, self.engine.running = [], []
            self.metrics.running.set(len(self.engine.running))
            self.metrics.kv_usage.set(sum(s.prefix for s in self.engine.running)
                                      / (self.engine.max_batch * self.engine.max_len))
            self.window["busy"] += time.perf_counter() - t0
            self.totals["busy"] += time.perf_counter() - t0

    def _advance(self, admit: list[Request]) -> None:
        for req in [r for r in self.active if r.cancelled]:
            self.engine.release(req.seq)
            self.active.remove(req)
            self.metrics.finished(req.reason, time.perf_counter() - req.arrived)
            # said, so a response that cancelled at a stop string reads the counts once the engine has let go
            req.publish(Update([], True))
        before = dict(self.engine.seconds)
        if admit:
            self.engine.admit([r.seq for r in admit])
            self.metrics.prompt_tokens.inc(sum(len(r.seq.prompt) for r in admit))
            self.metrics.cached_tokens.inc(sum(r.seq.result.cached_tokens for r in admit))
            self.active += admit
            self._publish(admit)  # the token prefill chose goes out now, not after the next step (vLLM's TTFT)
        busy = self.disable_by_batch_size is not None and len(self.engine.running) >= self.disable_by_batch_size
        t0 = time.perf_counter()
        stepped = self.engine.step(speculate=not busy)
        if stepped:  # SGLang's step_time_dict (SpecForge's tuning scripts read its 20th percentile)
            self.step_times.setdefault(len(stepped), deque(maxlen=1000)).append(time.perf_counter() - t0)
        self.metrics.step([s.result.accepted[-1] for s in stepped],
                          {k: v - before[k] for k, v in self.engine.seconds.items()},
                          [s.result.checked[-1] for s in stepped])
        self._log(stepped)
        self._publish(self.active)

    def _publish(self, reqs: list[Request]) -> None:
        """Each request's new tokens (and its end) to its response; the finished ones leave the active list."""
        now = time.perf_counter()
        for req in reqs:
            toks = req.seq.result.tokens
            if len(toks) > req.sent or req.seq.done:
                if req.sent == 0 and toks:
                    self.metrics.ttft.observe(now - req.arrived)
                self.metrics.generation_tokens.inc(len(toks) - req.sent)
                self.window["tokens"] += len(toks) - req.sent
                self.totals["tokens"] += len(toks) - req.sent
                # only the new tokens: a slow reader's pending update then holds each token once, not a copy of
                # the whole generation per step
                error = req.seq.result.error  # its constraints allowed no next token: the request fails alone
                req.publish(Update(toks[req.sent:], req.seq.done, error, 400, req.seq.result.logprobs[req.sent:]))
                req.sent = len(toks)
            if req.seq.done and req.seq.result.verify_steps:
                self.metrics.tau.observe(req.seq.result.tau)
            if req.seq.done:
                self.metrics.finished(req.seq.result.finish or "stop", now - req.arrived)
        self.active = [r for r in self.active if not r.seq.done]

    def _log(self, stepped: list[Sequence]) -> None:
        """Every log_every steps: running τ and generation throughput (busy time only) over the window, like
        SGLang's `accept len` line, and vLLM's `SpecDecoding metrics` line over the steps that drafted."""
        if not stepped:
            return
        w = self.window
        w["steps"] += 1
        w["seq_steps"] += len(stepped)
        w["accepted"] += sum(s.result.accepted[-1] for s in stepped)
        for s in (s for s in stepped if s.result.checked[-1]):
            w["drafts"], w["drafted"] = w["drafts"] + 1, w["drafted"] + s.result.checked[-1]
            w["at"] += [0] * (s.result.accepted[-1] - len(w["at"]))
            for k in range(s.result.accepted[-1]):
                w["at"][k] += 1
        self.totals["seq_steps"] += len(stepped)
        self.totals["accepted"] += sum(s.result.accepted[-1] for s in stepped)
        self.total_steps += 1
        if self.log_every and w["steps"] >= self.log_every:
            log.info("step %d: running %d, waiting %d, accept len %.2f, gen throughput %.1f tok/s",
                     self.total_steps, len(self.engine.running), len(self.waiting),
                     (w["accepted"] + w["seq_steps"]) / w["seq_steps"], w["tokens"] / max(w["busy"], 1e-9))
            if w["drafts"]:  # as vLLM words it (log parsers read "Mean acceptance length")
                accepted = sum(w["at"])
                log.info("SpecDecoding metrics: Mean acceptance length: %.2f, Accepted throughput: %.2f tokens/s, "
                         "Drafted throughput: %.2f tokens/s, Accepted: %d tokens, Drafted: %d tokens, Per-position "
                         "acceptance rate: %s, Avg Draft acceptance rate: %.1f%%", 1 + accepted / w["drafts"],
                         accepted / max(w["busy"], 1e-9), w["drafted"] / max(w["busy"], 1e-9), accepted, w["drafted"],
                         ", ".join(f"{n / w['drafts']:.3f}" for n in w["at"]), 100 * accepted / w["drafted"])
            self.window = {**dict.fromkeys(w, 0), "busy": 0.0, "at": []}
