"""Streaming, parallel token counting over corpus files.

Memory stays bounded: samples are read lazily, rendered into batches of `batch_size` texts, and each batch
is tokenized by the Rust tokenizer on all cores (`encode_batch*`, which releases the GIL) in a worker
thread while the main thread renders the next batch; at most two batches are alive at a time.
Modes: "all" counts every token of the rendered text; "assistant" counts only assistant tokens (and the
end-of-turn token), what EAGLE-3 trains on; plain-text samples have no assistant and are skipped there.
"""
from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path

import numpy as np
from jinja2 import TemplateError
from tqdm import tqdm

from toolkit.data.chat import ChatRenderer
from toolkit.data.schemas import BadRecord, ReadStats, read_samples

MODES = ("all", "assistant")


@dataclass
class CountResult:
    counts: np.ndarray  # int64[V]
    total: int
    mode: str
    files: list[ReadStats] = field(default_factory=list)
    skipped_text: int = 0  # plain-text samples skipped in assistant mode
    seconds: float = 0.0


def _batches(files, renderer: ChatRenderer, mode: str, batch_size: int, result: CountResult):
    """Yield (texts, spans or None) batches of rendered samples."""
    texts, spans = [], []
    for path in files:
        stats = ReadStats(str(path))
        result.files.append(stats)
        for i, sample in enumerate(read_samples(path, stats)):
            try:
                if isinstance(sample, str):
                    if mode == "assistant":
                        result.skipped_text += 1
                        continue
                    text, span = sample, None
                elif mode == "assistant":
                    text, span = renderer.render_with_spans(sample)
                else:
                    text, span = renderer.render(sample), None
            except (BadRecord, TemplateError) as e:
                stats.add_bad(f"{path} sample {i}", f"cannot render ({e})")
                continue
            texts.append(text)
            spans.append(span)
            if len(texts) == batch_size:
                yield texts, spans
                texts, spans = [], []
    if texts:
        yield texts, spans


def _count_batch(renderer: ChatRenderer, texts: list[str], spans: list, mode: str) -> np.ndarray:
    """Token ids to count in one batch (all of them, or only the assistant-masked ones)."""
    backend = renderer.tok.backend_tokenizer
    if mode == "all":
        encs = backend.encode_batch_fast(texts, add_special_tokens=False)
        ids = np.fromiter(chain.from_iterable(e.ids for e in encs), dtype=np.int64)
    else:
        encs = backend.encode_batch(texts, add_special_tokens=False)
        kept = []
        for e, span in zip(encs, spans):
            e_ids = e.ids
            mask = renderer.assistant_mask(e_ids, e.offsets, span)
            kept.extend(i for i, m in zip(e_ids, mask) if m)
        ids = np.asarray(kept, dtype=np.int64)
    return ids


def count_tokens(files: list[str | Path], renderer: ChatRenderer, vocab_size: int, mode: str = "all",
                 max_tokens: int | None = None, batch_size: int = 2048, progress: bool = True) -> CountResult:
    """Count token ids over the files; stops exactly at `max_tokens` when given."""
    if mode not in MODES:
        raise ValueError(f"counting mode {mode!r}; accepted: {MODES}")
    result = CountResult(np.zeros(vocab_size, dtype=np.int64), 0, mode)
    start = time.perf_counter()
    bar = tqdm(desc="counting", unit="tok", unit_scale=True, disable=not progress, mininterval=0.5)

    def absorb(ids: np.ndarray) -> bool:  # returns True when the token budget is reached
        if max_tokens is not None:
            ids = ids[: max_tokens - result.total]
        if len(ids) and int(ids.max()) >= vocab_size:
            raise ValueError(f"token id {int(ids.max())} >= vocabulary size {vocab_size}: the tokenizer and "
                             f"the target's vocabulary disagree")
        result.counts += np.bincount(ids, minlength=vocab_size)
        result.total += len(ids)
        bar.update(len(ids))
        return max_tokens is not None and result.total >= max_tokens

    with ThreadPoolExecutor(max_workers=1) as pool:
        pending: Future | None = None
        for texts, spans in _batches(files, renderer, mode, batch_size, result):
            job = pool.submit(_count_batch, renderer, texts, spans, mode)
            if pending is not None and absorb(pending.result()):
                pending = None
                job.cancel()
                break
            pending = job
        if pending is not None:
            absorb(pending.result())
    bar.close()
    result.seconds = time.perf_counter() - start
    return result
