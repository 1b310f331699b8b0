"""Streaming, parallel token counting over corpus files.

Memory stays bounded: samples are read lazily in batches of `batch_size`, and only a few batches are alive
at a time. Two exact ways to count a batch:
  * tokenizer: the main process renders it with the chat template and the Rust tokenizer tokenizes it on
    all cores (`encode_batch*` releases the GIL) in a thread, while the next batch is rendered;
  * pieces (byte-level BPE tokenizers, "all" mode, no token budget): worker processes render the batch, cut
    it into pieces and run BPE once per distinct piece (pieces.py); the main process only reads files.
    It is used only after the first batch, counted both ways, agrees exactly.
Modes: "all" counts every token of the rendered text; "assistant" counts only assistant tokens (and the
end-of-turn token), what EAGLE-3 trains on; plain-text samples have no assistant and are skipped there.
"""
from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import sys
import time
import warnings
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path

import numpy as np
from jinja2 import TemplateError
from tqdm import tqdm

from toolkit.data.chat import ChatRenderer, TemplateRenderer
from toolkit.data.schemas import BadRecord, ReadStats, read_samples
from toolkit.tokenmap.maps import TokenMapError
from toolkit.tokenmap.pieces import PieceCounter

MODES = ("all", "assistant")
Batch = list  # [(file index, sample index, Sample), ...]


@dataclass
class CountResult:
    counts: np.ndarray  # int64[V]
    total: int
    mode: str
    files: list[ReadStats] = field(default_factory=list)
    skipped_text: int = 0  # plain-text samples skipped in assistant mode
    seconds: float = 0.0
    method: str = "tokenizer"  # or "pieces"


def usable_cpus() -> int:
    """The CPUs this process may run on (a container's or taskset's share, not the host's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _sample_batches(files, mode: str, batch_size: int, result: CountResult, first_size: int | None = None):
    """Batches of samples; the first may be smaller (it is counted twice when checking piece counting)."""
    batch: Batch = []
    size = first_size or batch_size
    for f, path in enumerate(files):
        stats = ReadStats(str(path))
        result.files.append(stats)
        for i, sample in enumerate(read_samples(path, stats)):
            if isinstance(sample, str) and mode == "assistant":
                result.skipped_text += 1
                continue
            batch.append((f, i, sample))
            if len(batch) == size:
                yield batch
                batch, size = [], batch_size
    if batch:
        yield batch


def _render(render, batch: Batch, mode: str, spans_of=None):
    """(texts, spans, errors) of a batch; errors are (file index, where, why) for unrenderable samples."""
    texts, spans, errors = [], [], []
    for f, i, sample in batch:
        try:
            if isinstance(sample, str):
                samples = [(sample, None)]
            elif mode == "assistant":  # one sample per answer where the template rewrites earlier ones (Qwen3)
                samples = spans_of(sample)
            else:
                samples = [(render(sample), None)]
        except (BadRecord, TemplateError) as e:
            errors.append((f, f"sample {i}", f"cannot render ({e})"))
            continue
        for text, span in samples:
            texts.append(text)
            spans.append(span)
    return texts, spans, errors


def _tokenize_and_count(renderer: ChatRenderer, texts: list[str], spans: list, mode: str) -> np.ndarray:
    """Token ids to count in one batch (all of them, or only the assistant-masked ones)."""
    backend = renderer.tok.backend_tokenizer
    if mode == "all":
        encs = backend.encode_batch_fast(texts, add_special_tokens=False)
        return np.fromiter(chain.from_iterable(e.ids for e in encs), dtype=np.int64)
    kept = []
    for e, span in zip(backend.encode_batch(texts, add_special_tokens=False), spans):
        ids = e.ids
        kept.extend(i for i, m in zip(ids, renderer.assistant_mask(ids, e.offsets, span)) if m)
    return np.asarray(kept, dtype=np.int64)


_worker: dict = {}  # per worker process: its own renderer and piece counter (set by _init_worker)


def _init_worker(counter: PieceCounter | str, render: TemplateRenderer, vocab_size: int) -> None:
    """`counter` is the parent's own (inherited through fork, never pickled) or, under spawn, the tokenizer
    JSON to build one from."""
    counter = PieceCounter.build(counter) if isinstance(counter, str) else counter
    _worker.update(counter=counter, render=render, vocab_size=vocab_size)


def _piece_job(batch: Batch):
    texts, _, errors = _render(_worker["render"], batch, "all")
    counter = _worker["counter"]
    return counter.token_counts(*counter.splitter.count_pieces(texts), _worker["vocab_size"]), errors


def _pool(workers: int, counter: PieceCounter, renderer: ChatRenderer, vocab_size: int) -> ProcessPoolExecutor:
    # fork where there is fork: workers start in milliseconds and inherit the piece counter. Forking a
    # process with threads is safe here: the tokenizer's threads are idle (no batch is being tokenized while
    # the pool runs), and children only run regex and BPE-per-piece code.
    fork = "fork" in multiprocessing.get_all_start_methods()
    initargs = (counter if fork else renderer.tok.backend_tokenizer.to_str(), renderer.render, vocab_size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: "process is multi-threaded, fork..."
        return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork" if fork else "spawn"),
                                   initializer=_init_worker, initargs=initargs)


@contextlib.contextmanager
def _frozen_gc():
    """Children's garbage collector would otherwise walk (and so copy, page by page) the parent's heap."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _count_by_pieces(batches, counter: PieceCounter, renderer: ChatRenderer, vocab_size: int, add,
                     workers: int) -> None:
    with _frozen_gc(), _pool(workers, counter, renderer, vocab_size) as pool:
        pending: deque[Future] = deque()
        for batch in batches:
            pending.append(pool.submit(_piece_job, batch))
            if len(pending) > workers:  # bounded: at most workers + 1 batches alive
                add(*pending.popleft().result())
        while pending:
            add(*pending.popleft().result())


def count_tokens(files: list[str | Path], renderer: ChatRenderer, vocab_size: int, mode: str = "all",
                 max_tokens: int | None = None, batch_size: int = 2048, progress: bool = True,
                 num_workers: int | None = None, pieces: bool = True) -> CountResult:
    """Count token ids over the files; stops exactly at `max_tokens` when given."""
    if mode not in MODES:
        raise ValueError(f"counting mode {mode!r}; accepted: {MODES}")
    result = CountResult(np.zeros(vocab_size, dtype=np.int64), 0, mode)
    start = time.perf_counter()
    bar = tqdm(desc="counting", unit="tok", unit_scale=True, disable=not progress, mininterval=0.5)

    def add(counts: np.ndarray, errors=()) -> None:
        if len(counts) > vocab_size:  # a token added to the tokenizer but not to the target's embedding
            raise TokenMapError(f"the corpus holds token id {len(counts) - 1}, beyond the target's vocabulary "
                                f"(config.json vocab_size {vocab_size}; the tokenizer has {len(renderer.tok)} "
                                f"ids): the tokenizer and the target disagree")
        for f, where, why in errors:
            result.files[f].add_bad(f"{result.files[f].path} {where}", why)
        result.counts += counts
        n = int(counts.sum())
        result.total += n
        bar.update(n)

    def absorb(ids: np.ndarray, errors) -> bool:  # returns True when the token budget is reached
        if max_tokens is not None:
            ids = ids[: max_tokens - result.total]
        add(np.bincount(ids, minlength=vocab_size), errors)
        return max_tokens is not None and result.total >= max_tokens

    use_pieces = pieces and mode == "all" and max_tokens is None
    counter = PieceCounter.build(renderer.tok.backend_tokenizer) if use_pieces else None
    batches = iter(_sample_batches(files, mode, batch_size, result, 256 if counter is not None else None))
    if counter is not None and (first := next(batches, None)) is not None:
        texts, spans, errors = _render(renderer.render, first, mode, renderer.render_samples)
        exact = np.bincount(_tokenize_and_count(renderer, texts, spans, mode), minlength=vocab_size)
        add(exact, errors)
        if np.array_equal(counter.token_counts(*counter.splitter.count_pieces(texts), vocab_size), exact):
            result.method = "pieces"
            _count_by_pieces(batches, counter, renderer, vocab_size, add, max(1, num_workers or usable_cpus()))
        else:
            print("note: counting by pieces disagrees with the tokenizer on this corpus; tokenizing every "
                  "text instead", file=sys.stderr)

    with ThreadPoolExecutor(max_workers=1) as pool:  # what is left (everything, unless pieces were used)
        last: tuple[Future, list] | None = None
        for batch in batches:
            texts, spans, errors = _render(renderer.render, batch, mode, renderer.render_samples)
            job = pool.submit(_tokenize_and_count, renderer, texts, spans, mode)
            if last is not None and absorb(last[0].result(), last[1]):
                last = None
                job.cancel()
                break
            last = (job, errors)
        if last is not None:
            absorb(last[0].result(), last[1])
    bar.close()
    result.seconds = time.perf_counter() - start
    return result
