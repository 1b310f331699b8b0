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

The heap gauge is the leak signal. RSS is not one: served with the speed settings (MALLOC_TRIM_THRESHOLD_ and
MALLOC_MMAP_THRESHOLD_ large), glibc never returns memory, so RSS is a high-water mark that a leak fills into
unseen and that one busy moment raises for good. Live bytes (`mallinfo2`: in-use arena chunks + mmapped chunks)
count every CPU tensor and C allocation that is still held.
"""
from __future__ import annotations

import ctypes
import ctypes.util

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


class ServerMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, max_tau: int = 8):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("toolkit_requests", "finished HTTP requests", ["endpoint", "code"], registry=r)
        self.prompt_tokens = Counter("toolkit_prompt_tokens", "prompt tokens of admitted requests", registry=r)
        self.cached_tokens = Counter("toolkit_cached_prompt_tokens", "prompt tokens the prefix cache held",
                                     registry=r)
        self.generation_tokens = Counter("toolkit_generation_tokens", "generated tokens", registry=r)
        self.verify_steps = Counter("toolkit_verify_steps", "verify forwards per sequence", registry=r)
        self.accepted_tokens = Counter("toolkit_accepted_tokens", "accepted draft tokens", registry=r)
        self.accepted_at = Counter("toolkit_accepted_at_position", "verify steps accepting draft position k",
                                   ["position"], registry=r)
        buckets = [1 + i / 4 for i in range(4 * max_tau + 1)]
        self.tau = Histogram("toolkit_request_tau", "tokens per verify step of a finished request",
                             buckets=buckets, registry=r)
        self.step_seconds = Histogram("toolkit_step_seconds", "engine time per call", ["phase"], registry=r,
                                      buckets=[.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10])
        self.ttft = Histogram("toolkit_time_to_first_token_seconds", "arrival to first token", registry=r,
                              buckets=[.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60])
        self.cancelled = Counter("toolkit_cancelled_requests", "requests whose client went away", registry=r)
        self.running = Gauge("toolkit_running_requests", "sequences in the running batch", registry=r)
        self.waiting = Gauge("toolkit_waiting_requests", "requests queued for a batch slot", registry=r)
        if (read := heap_reader()) is not None:
            Gauge("toolkit_heap_in_use_bytes", "bytes held from the C allocator (mallinfo2)",
                  registry=r).set_function(read)

    def step(self, accepted: list[int], seconds: dict[str, float]) -> None:
        """One engine step: each sequence's accepted draft length, and the time per phase."""
        self.verify_steps.inc(len(accepted))
        self.accepted_tokens.inc(sum(accepted))
        for a in accepted:
            for k in range(1, a + 1):
                self.accepted_at.labels(position=str(k)).inc()
        for phase, s in seconds.items():
            if s > 0:
                self.step_seconds.labels(phase=phase).observe(s)

    def render(self) -> bytes:
        return generate_latest(self.registry)
