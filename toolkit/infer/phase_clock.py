"""Timing the engine's phases (prefill, draft, verify) without stopping the device.

On a GPU a point in time is a CUDA event on the device's timeline: graph replays run asynchronously, and
syncing the host to read a clock would stop it queueing the next phase while the device works. Elsewhere it
is the host clock."""
from __future__ import annotations

import time

import torch


class PhaseClock:
    def __init__(self, device: torch.device):
        self.device = device
        self._stream = None  # looked up once, in the thread that steps: tens of microseconds a lookup

    def mark(self):
        """A point in time: a recorded CUDA event on a GPU, else perf_counter's seconds."""
        if self.device.type != "cuda":
            return time.perf_counter()
        if self._stream is None:
            self._stream = torch.cuda.current_stream(self.device)
        event = torch.cuda.Event(enable_timing=True)
        event.record(self._stream)
        return event

    @staticmethod
    def between(start, end) -> float:
        """Seconds from one mark to a later one (waits for the device to reach `end`)."""
        if isinstance(start, float):
            return end - start
        end.synchronize()
        return start.elapsed_time(end) / 1e3
