"""Prometheus metrics of one server (its own registry, no process-wide globals).

    toolkit_requests_total{endpoint,code}        finished HTTP requests by status code
    toolkit_prompt_tokens_total, toolkit_generation_tokens_total
    toolkit_cached_prompt_tokens_total           prompt tokens copied from the prefix cache, not prefilled
    toolkit_verify_steps_total                   target verify forwards, summed over sequences
    toolkit_accepted_tokens_total                draft tokens accepted (τ = (accepted + steps) / steps)
    toolkit_accepted_at_position_total{position} verify steps that accepted draft position k (k = 1, 2, ...)
    toolkit_request_tau                          histogram of per-request τ
    toolkit_step_seconds{phase}                  prefill / draft / verify time per engine call
    toolkit_time_to_first_token_seconds          from arrival to the first token
    toolkit_cancelled_requests_total             clients that went away before the end
    toolkit_running_requests, toolkit_waiting_requests
    toolkit_heap_in_use_bytes                    bytes the C allocator has handed out and not had back (glibc only)

The same figures are exported under vLLM's and SGLang's names too, so dashboards and scripts made for either read
this server as they are (labels model_name, and engine="0" for vLLM's):

    vllm:spec_decode_num_drafts_total, vllm:spec_decode_num_draft_tokens_total,
    vllm:spec_decode_num_accepted_tokens_total, vllm:spec_decode_num_accepted_tokens_per_pos_total{position}
                                                 (position 0-based: the first draft token is position 0; one per
                                                 draft position, draft_positions(); none without speculation)
    vllm:num_requests_running, vllm:num_requests_waiting, vllm:prompt_tokens_total, vllm:generation_tokens_total,
    vllm:time_to_first_token_seconds, vllm:e2e_request_latency_seconds, vllm:request_success_total{finished_reason}
                                                 (stop, length, abort: each at 0 from the start; a cancelled request
                                                 is abort, queued or running, one a stop string ended is stop)
    vllm:kv_cache_usage_perc, sglang:token_usage  share (0..1) of the batch's cache slots the running sequences fill
    sglang:spec_accept_length                    τ over the last 40 engine steps (SGLang's log interval)
    sglang:num_running_reqs, sglang:num_queue_reqs, sglang:prompt_tokens_total, sglang:generation_tokens_total,
    sglang:time_to_first_token_seconds, sglang:e2e_request_latency_seconds

A draft token is a tree node after the root that a verify step checked (a chain of k: k per step), so vLLM's
acceptance rate, accepted / draft tokens, reads as there; a tree's is lower by design (one path can be accepted).

The heap gauge is the leak signal. RSS is not one: served with the speed settings (MALLOC_TRIM_THRESHOLD_ and
MALLOC_MMAP_THRESHOLD_ large), glibc never returns memory, so RSS is a high-water mark that a leak fills into
unseen and that one busy moment raises for good. Live bytes (`mallinfo2`: in-use arena chunks + mmapped chunks)
count every CPU tensor and C allocation that is still held.
"""
from __future__ import annotations

import ctypes
import ctypes.util
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def heap_reader():
    """A function returning the bytes glibc's malloc has in use now, or None where there is no mallinfo2
    (glibc < 2.33, musl, macOS)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallinfo2 = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _MallInfo2

    def read() -> float:
        info = mallinfo2()
        return float(info.uordblks + info.hblkhd)
    return read


class _Fan:
    """One figure under several names: each inc / set / observe goes to every one."""

    def __init__(self, *metrics):
        self.metrics = metrics

    def inc(self, value: float = 1) -> None:
        for m in self.metrics:
            m.inc(value)

    def set(self, value: float) -> None:
        for m in self.metrics:
            m.set(value)

    def observe(self, value: float) -> None:
        for m in self.metrics:
            m.observe(value)


def draft_positions(engine) -> int:
    """The draft positions one verify step can accept (what usage's accept_rate_by_position and vLLM's per-position
    series cover): the tree's depth with a draft head, the prompt lookup's length with lookup (the longer of the
    two with both), 0 without speculation."""
    return max(engine.tree.num_steps if engine.head is not None else 0,
               engine.lookup.num_tokens if engine.lookup is not None else 0)


TTFT_BUCKETS = [.001, .005, .01, .02, .04, .06, .08, .1, .25, .5, .75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560]
E2E_BUCKETS = [.3, .5, .8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680]  # vLLM's


class ServerMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, max_tau: int = 8, model_name: str = "toolkit"):
        """max_tau: the most tokens one verify step emits (draft_positions + 1; 1: no speculation, and then no vLLM
        spec_decode series, as vLLM has none without a speculative config)."""
        self.registry = r = CollectorRegistry()
        vl = {"model_name": model_name, "engine": "0"}  # vLLM's labels

        def vllm(kind, name, doc, extra=(), **kw):
            return kind(f"vllm:{name}", doc, [*vl, *extra], registry=r, **kw)

        def sglang(kind, name, doc, **kw):
            return kind(f"sglang:{name}", doc, ["model_name"], registry=r, **kw).labels(model_name=model_name)

        self.speculating = max_tau > 1
        if self.speculating:
            self.vllm_drafts = vllm(Counter, "spec_decode_num_drafts", "verify steps checking drafts").labels(**vl)
            self.vllm_draft_tokens = vllm(Counter, "spec_decode_num_draft_tokens", "draft tokens checked").labels(**vl)
            self.vllm_accepted = vllm(Counter, "spec_decode_num_accepted_tokens", "draft tokens accepted").labels(**vl)
            self.vllm_per_pos = vllm(Counter, "spec_decode_num_accepted_tokens_per_pos", "accepted at draft position",
                                     ["position"])
            for position in range(max_tau - 1):  # every position at 0 from the start, as vLLM: a ratio reads 0
                self.vllm_per_pos.labels(**vl, position=str(position))
        self.vllm_success = vllm(Counter, "request_success", "finished requests", ["finished_reason"])
        for reason in ("stop", "length", "abort"):  # each at 0 from the start, as vLLM: rate() reads 0, not no data
            self.vllm_success.labels(**vl, finished_reason=reason)
        self.e2e = _Fan(vllm(Histogram, "e2e_request_latency_seconds", "arrival to the last token",
                             buckets=E2E_BUCKETS).labels(**vl),
                        sglang(Histogram, "e2e_request_latency_seconds", "arrival to the last token",
                               buckets=E2E_BUCKETS))
        self.sglang_accept = sglang(Gauge, "spec_accept_length", "tokens per verify step over the last 40 steps")
        self.recent = deque(maxlen=40)  # (accepted, sequence steps) of the last engine steps
        self.requests = Counter("toolkit_requests", "finished HTTP requests", ["endpoint", "code"], registry=r)
        self.prompt_tokens = _Fan(Counter("toolkit_prompt_tokens", "prompt tokens of admitted requests", registry=r),
                                  vllm(Counter, "prompt_tokens", "prompt tokens").labels(**vl),
                                  sglang(Counter, "prompt_tokens", "prompt tokens"))
        self.cached_tokens = Counter("toolkit_cached_prompt_tokens", "prompt tokens the prefix cache held",
                                     registry=r)
        self.generation_tokens = _Fan(Counter("toolkit_generation_tokens", "generated tokens", registry=r),
                                      vllm(Counter, "generation_tokens", "generated tokens").labels(**vl),
                                      sglang(Counter, "generation_tokens", "generated tokens"))
        self.verify_steps = Counter("toolkit_verify_steps", "verify forwards per sequence", registry=r)
        self.accepted_tokens = Counter("toolkit_accepted_tokens", "accepted draft tokens", registry=r)
        self.accepted_at = Counter("toolkit_accepted_at_position", "verify steps accepting draft position k",
                                   ["position"], registry=r)
        buckets = [1 + i / 4 for i in range(4 * max_tau + 1)]
        self.tau = Histogram("toolkit_request_tau", "tokens per verify step of a finished request",
                             buckets=buckets, registry=r)
        self.step_seconds = Histogram("toolkit_step_seconds", "engine time per call", ["phase"], registry=r,
                                      buckets=[.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10])
        self.ttft = _Fan(Histogram("toolkit_time_to_first_token_seconds", "arrival to first token", registry=r,
                                   buckets=[.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60]),
                         vllm(Histogram, "time_to_first_token_seconds", "arrival to first token",
                              buckets=TTFT_BUCKETS).labels(**vl),
                         sglang(Histogram, "time_to_first_token_seconds", "arrival to first token",
                                buckets=TTFT_BUCKETS))
        self.cancelled = Counter("toolkit_cancelled_requests", "requests whose client went away", registry=r)
        self.running = _Fan(Gauge("toolkit_running_requests", "sequences in the running batch", registry=r),
                            vllm(Gauge, "num_requests_running", "sequences in the running batch").labels(**vl),
                            sglang(Gauge, "num_running_reqs", "sequences in the running batch"))
        self.waiting = _Fan(Gauge("toolkit_waiting_requests", "requests queued for a batch slot", registry=r),
                            vllm(Gauge, "num_requests_waiting", "requests queued for a batch slot").labels(**vl),
                            sglang(Gauge, "num_queue_reqs", "requests queued for a batch slot"))
        self.kv_usage = _Fan(vllm(Gauge, "kv_cache_usage_perc", "share of the KV cache's slots the running "
                                  "sequences fill (0..1)").labels(**vl),
                             sglang(Gauge, "token_usage", "share of the KV cache's slots the running sequences fill"))
        self.vl = vl
        if (read := heap_reader()) is not None:
            Gauge("toolkit_heap_in_use_bytes", "bytes held from the C allocator (mallinfo2)",
                  registry=r).set_function(read)

    def step(self, accepted: list[int], seconds: dict[str, float], checked: list[int] | None = None) -> None:
        """One engine step: each sequence's accepted draft length, the time per phase, and the draft tokens each
        sequence's verify checked (tree nodes after the root; None: not known, vLLM's counts stay as they are)."""
        self.verify_steps.inc(len(accepted))
        self.accepted_tokens.inc(sum(accepted))
        for a in accepted:
            for k in range(1, a + 1):
                self.accepted_at.labels(position=str(k)).inc()
                if self.speculating:
                    self.vllm_per_pos.labels(**self.vl, position=str(k - 1)).inc()
        if checked is not None and self.speculating:
            self.vllm_drafts.inc(sum(n > 0 for n in checked))
            self.vllm_draft_tokens.inc(sum(checked))
            self.vllm_accepted.inc(sum(accepted))
        if accepted:
            self.recent.append((sum(accepted), len(accepted)))
            self.sglang_accept.set(sum(a + n for a, n in self.recent) / sum(n for _, n in self.recent))
        for phase, s in seconds.items():
            if s > 0:
                self.step_seconds.labels(phase=phase).observe(s)

    def finished(self, reason: str, seconds: float) -> None:
        """A request ended: `reason` stop | length | abort (vLLM's finished_reason), `seconds` since it arrived."""
        self.vllm_success.labels(**self.vl, finished_reason=reason).inc()
        self.e2e.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
