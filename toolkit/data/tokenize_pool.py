"""prepare-data's batches rendered and tokenized in worker processes (`--num-proc`, SpecForge's
build-dataset-num-proc): the chat template is Python, one core's work, so a corpus of a million conversations
takes minutes per core. Results come back in submit order, so the rows and their order are the same for any
number of processes; one process computes in place."""
from __future__ import annotations

import multiprocessing
import os
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from typing import Iterator

_WORKER = {}  # a worker process's renderer and max_len, set once by its initializer


def _init(renderer, max_len: int) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # a forked tokenizer's threads: one process, one thread
    _WORKER.update(renderer=renderer, max_len=max_len)


def _tokenize(batch: list) -> tuple[list[dict], dict]:
    from toolkit.data.prepare import tokenize

    return tokenize(_WORKER["renderer"], batch, _WORKER["max_len"])


class TokenizePool:
    def __init__(self, renderer, max_len: int, workers: int = 1):
        self.renderer, self.max_len = renderer, max_len
        self.pending: deque = deque()
        self.pool = None
        if workers > 1:  # fork where there is fork: workers start at once with the renderer inherited
            ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
            self.pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init, initargs=(renderer, max_len))
        self.window = 2 * workers  # batches in flight: every worker busy, memory bounded

    def submit(self, batch: list, tag) -> Iterator[tuple[tuple[list[dict], dict], object]]:
        """Queue `batch`; yield ((rows, counts), tag) of the batches done so far, in submit order."""
        from toolkit.data.prepare import tokenize

        if self.pool is None:
            yield tokenize(self.renderer, batch, self.max_len), tag
            return
        self.pending.append((self.pool.submit(_tokenize, batch), tag))
        while len(self.pending) > self.window:
            future, done_tag = self.pending.popleft()
            yield future.result(), done_tag

    def finish(self) -> Iterator[tuple[tuple[list[dict], dict], object]]:
        """The batches still in flight, in order; then the workers stop."""
        try:
            while self.pending:
                future, tag = self.pending.popleft()
                yield future.result(), tag
        finally:
            if self.pool is not None:
                self.pool.shutdown(cancel_futures=True)
