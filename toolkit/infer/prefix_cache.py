"""Automatic prefix caching (vLLM's APC, SGLang's radix cache), by whole cache rows: a sequence that leaves the
running batch leaves its KV behind in one of `rows` spare rows of the engine's caches (the target's and the draft
head's), and a new prompt that starts with the same tokens copies that prefix into its own row and prefills only
the rest. A second chat turn (which re-sends the first turn and its answer), a shared system prompt or tool list,
a Responses `previous_response_id` chain: each prefills only what is new.

What a row holds: the target's KV for its first `kv` tokens and the draft's pairs (token t+1, target hidden t) for
t < `drafted`. A hit of `c` shared tokens reuses L = min(c - 1, kv, drafted) positions: the prompt's position L-1
is prefilled again, because the draft's pair at L-1 needs the target's hidden state there and only KV is kept.
The prefilled rest attends over the copied slots exactly as it would over its own (causal by position), so the
output is plain prefill's (greedy: token for token, up to float rounding in the order of the sums).

Prompts admitted together share too: a prompt may copy from the row of one admitted just ahead of it (prefilled
first), so n choices of one prompt prefill it once. Entries that a new one extends (a conversation's earlier
turn) give their row to it; otherwise a free row is taken, else the least recently used entry's.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Entry:
    tokens: np.ndarray  # the ids whose KV the row holds, [kv]
    drafted: int        # draft pairs held: positions 0..drafted-1 (kv when the engine runs no head)
    row: int
    used: int           # when it was last stored or hit (least recently used goes first)


def shared(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading ids a and b share."""
    m = min(len(a), len(b))
    differ = np.flatnonzero(a[:m] != b[:m])
    return int(differ[0]) if len(differ) else m


class PrefixCache:
    def __init__(self, first_row: int, rows: int):
        """Spare cache rows first_row .. first_row + rows - 1 (after the running batch's)."""
        if rows < 1:
            raise ValueError(f"a prefix cache needs at least one spare row, got {rows}")
        self.free, self.entries, self.clock = list(range(first_row, first_row + rows)), [], 0
        self.queried = self.hit = 0  # prompt tokens looked up / found cached, for metrics

    def match(self, prompt: list[int], earlier: list[tuple[int, list[int]]] = ()) -> tuple[int | None, int]:
        """The row to copy from and how many of the prompt's positions it gives (None, 0: a miss). At least one
        prompt token is always left to prefill: its logits pick the first new token. earlier: (row, prompt) of
        the prompts admitted with this one ahead of it, whose rows hold their whole prompt by the time this one
        is prefilled (n choices of one prompt prefill it once)."""
        ids, best, reuse = np.asarray(prompt), None, 0
        held = [(e.tokens, e.drafted, e) for e in self.entries] + [(np.asarray(p), len(p), row) for row, p in earlier]
        for tokens, drafted, where in held:
            n = min(shared(tokens, ids) - 1, len(tokens), drafted)
            if n > reuse:
                best, reuse = where, n
        self.queried += len(prompt)
        if best is None:
            return None, 0
        self.hit += reuse
        if not isinstance(best, Entry):
            return best, reuse
        self.clock += 1
        best.used = self.clock
        return best.row, reuse

    def plan(self, prompts: list[list[int]], rows: range, usable: list[bool]) -> list[tuple[int | None, int]]:
        """match() for prompts admitted together into `rows`, in order, each also against the ones ahead of it
        (every prompt read into an array once); usable[i] False: none for prompt i (it needs every position's
        logits)."""
        ids = [np.asarray(p) for p in prompts]
        return [self.match(p, [(rows[j], ids[j]) for j in range(i)]) if usable[i] else (None, 0)
                for i, p in enumerate(ids)]

    def store(self, tokens: list[int], drafted: int, copy) -> None:
        """Keep a leaving sequence's first len(tokens) positions: copy(dst_row) copies its KV (and draft pairs)
        there. Nothing is copied when an entry already holds these tokens (or more of them)."""
        if len(tokens) < 2:
            return
        ids, self.clock = np.asarray(tokens), self.clock + 1
        for e in self.entries:
            if shared(e.tokens, ids) == len(ids) and e.drafted >= min(drafted, len(ids)):  # held already
                e.used = self.clock
                return
        extended = [e for e in self.entries if shared(e.tokens, ids) == len(e.tokens)]
        if extended:  # an earlier turn of this conversation: its row goes to the longer one
            row = extended[0].row
            self.entries = [e for e in self.entries if e is not extended[0]]
        elif self.free:
            row = self.free.pop(0)
        else:
            oldest = min(self.entries, key=lambda e: e.used)
            row = oldest.row
            self.entries = [e for e in self.entries if e is not oldest]
        copy(row)
        self.entries.append(Entry(ids, drafted, row, self.clock))

    def keep(self, seq, move, drafts: bool) -> None:
        """A leaving sequence's KV kept: its prompt and tokens through the last one the cache holds (the root, its
        last token, is not yet; nor, after a stop inside an accepted path, are that path's later nodes).
        move(dst_row, n) copies its first n positions; drafts: the engine runs a head (its pairs count)."""
        held = seq.prompt + seq.result.tokens
        kv = min(seq.prefix, len(held) - 1)
        self.store(held[:kv], min(seq.drafted, kv) if drafts else kv, lambda dst: move(dst, kv))

    def clear(self) -> None:
        self.free += [e.row for e in self.entries]
        self.entries = []

