"""Batch order: deterministic, length-grouped, disjoint across ranks, resumable at any micro-batch."""
from __future__ import annotations

import itertools
import random

import pytest
import torch

from toolkit.train.data import batch_order, collate, micro_batches

_RNG = random.Random(0)
LENGTHS = [_RNG.randint(5, 500) for _ in range(300)]
ROWS = list(range(290))


def test_order_depends_only_on_seed_and_epoch_and_covers_every_row_once():
    a, b = batch_order(LENGTHS, ROWS, 4, 0, 0), batch_order(LENGTHS, ROWS, 4, 0, 0)
    assert a == b and a != batch_order(LENGTHS, ROWS, 4, 0, 1) and a != batch_order(LENGTHS, ROWS, 4, 1, 0)
    assert sorted(r for batch in a for r in batch) == ROWS
    # length grouping: padding is far below what a random split gives
    waste = lambda bs: sum(max(LENGTHS[r] for r in x) * len(x) - sum(LENGTHS[r] for r in x) for x in bs)  # noqa
    rnd = [ROWS[i:i + 4] for i in range(0, len(ROWS), 4)]
    assert waste(a) < waste(rnd) / 5


def test_ranks_are_disjoint_and_skip_resumes_exactly():
    take = lambda it, n: list(itertools.islice(it, n))  # noqa: E731
    r0, r1 = take(micro_batches(LENGTHS, ROWS, 4, 0, 0, 2), 36), take(micro_batches(LENGTHS, ROWS, 4, 0, 1, 2), 36)
    assert not {r for _, b in r0 for r in b} & {r for _, b in r1 for r in b}
    full = take(micro_batches(LENGTHS, ROWS, 4, 0, 0, 1), 100)  # crosses into epoch 1
    assert full[80][0] == 1
    assert take(micro_batches(LENGTHS, ROWS, 4, 0, 0, 1, skip=57), 43) == full[57:]


def test_ranks_take_turns_in_one_stream_across_epochs():
    """290 rows in micro-batches of 4 make 73 a epoch: dealt per epoch, rank 0 took 37 and rank 1 36, so rank 1
    entered epoch 1 a micro-batch early and 2 ranks no longer took the micro-batches one process accumulating 2
    a step takes; and a resume skips alike."""
    take = lambda it, n: list(itertools.islice(it, n))  # noqa: E731
    one = take(micro_batches(LENGTHS, ROWS, 4, 0, 0, 1), 200)
    r0, r1 = take(micro_batches(LENGTHS, ROWS, 4, 0, 0, 2), 100), take(micro_batches(LENGTHS, ROWS, 4, 0, 1, 2), 100)
    assert [x for pair in zip(r0, r1) for x in pair] == one
    assert take(micro_batches(LENGTHS, ROWS, 4, 0, 1, 2, skip=40), 60) == r1[40:]
    with pytest.raises(ValueError, match="make 2 micro-batches of 4, fewer than the 3 processes"):
        next(micro_batches(LENGTHS, ROWS[:8], 4, 0, 0, 3))


def test_collate_pads_right_and_marks_valid_keys():
    items = [{"input_ids": torch.tensor([5, 6, 7]), "loss_mask": torch.tensor([0, 1, 1])},
             {"input_ids": torch.tensor([8]), "loss_mask": torch.tensor([1])}]
    b = collate(items)
    assert b["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]] and b["loss_mask"].tolist() == [[0, 1, 1], [1, 0, 0]]
    assert b["valid"].tolist() == [[True, True, True], [True, False, False]]


def test_the_draft_vocabulary_is_counted_chunk_by_chunk(prepared):
    """Every rank held every assistant id of the corpus as one int64 tensor (~8 GB for 300 M ids): the ids now
    come in chunks and are counted as they come, with the same vocabulary."""
    from toolkit.train.data import PreparedData
    from toolkit.train.head import draft_vocab

    data = PreparedData(prepared, 96)
    rows = list(range(len(data)))
    whole = torch.cat(list(data.assistant_tokens(rows)))
    chunks = list(data.assistant_tokens(rows, chunk=50))
    assert len(chunks) > 3 and torch.equal(torch.cat(chunks), whole)
    assert draft_vocab(iter(chunks), 40, 49152, [2]) == draft_vocab(whole, 40, 49152, [2])


def test_prefetch_yields_every_item_in_order_and_reads_the_next_one_ahead():
    """A step's rows are read on a background thread while the step before computes; the order is unchanged
    (a resumed run skips by count) and an error reading them reaches the loop."""
    import threading

    from toolkit.train.data import prefetch

    made = []

    def items():
        for i in range(5):
            made.append((i, threading.current_thread().name))
            yield i

    got = []
    for item in prefetch(items()):
        got.append(item)
        if item == 1:  # item 2 is made while item 1 is in use, without the loop asking for it
            import time

            deadline = time.monotonic() + 10
            while len(made) < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(made) == 3
    assert got == [0, 1, 2, 3, 4] and all(name.startswith("prefetch") for _, name in made)

    def broken():
        yield 0
        raise OSError("shard unreadable")

    with pytest.raises(OSError, match="shard unreadable"):
        list(prefetch(broken()))
