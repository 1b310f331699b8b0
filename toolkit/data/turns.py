"""Answering a conversation's turns in order, shared by `toolkit regenerate`'s engine and endpoint modes: turn
k+1 is asked after the target's own answer to turn k, and a turn that gets no answer ends the conversation
at the turns answered before it, with the reason kept."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

ON_LENGTH = ("keep", "drop")  # an answer cut at --max-new-tokens: kept as it is, or the conversation ends before it


@dataclass
class Answer:
    """One turn's answer, or why there is none."""
    text: str | None = None
    cut: bool = False          # generation stopped at --max-new-tokens
    too_long: bool = False     # the prompt no longer fits the context
    error: str | None = None   # refused or failed: the reason


@dataclass
class Outcome:
    """How a conversation ended: `stop` None when every turn was answered; else "too long" (the prompt outgrew
    the context), "cut" (an answer cut at --max-new-tokens, with --on-length drop) or "failed" (`error`),
    at turn `turn` (1-based), the turns before it kept."""
    answered: int = 0
    cut: int = 0               # answers kept though cut at --max-new-tokens
    stop: str | None = None
    turn: int = 0
    error: str | None = None


def answer_all(skeletons: list[list], answer_batch: Callable[[list[list[dict]]], list[Answer]],
               on_length: str = "keep") -> list[tuple[list[dict], Outcome]]:
    """Fill every None in the skeletons turn by turn: each round asks the next open turn of every conversation
    in one batch. A turn without an answer (or cut, with on_length "drop") ends its conversation there."""
    convs: list[list[dict]] = [[] for _ in skeletons]
    outcomes = [Outcome() for _ in skeletons]
    pos = [0] * len(skeletons)
    while True:
        todo = []
        for j, sk in enumerate(skeletons):
            while pos[j] < len(sk) and sk[pos[j]] is not None:
                convs[j].append(sk[pos[j]])
                pos[j] += 1
            if pos[j] < len(sk):
                todo.append(j)
        if not todo:
            return list(zip(convs, outcomes))
        for j, a in zip(todo, answer_batch([convs[j] for j in todo])):
            o = outcomes[j]
            if a.text is None or (a.cut and on_length == "drop"):
                o.stop = "too long" if a.too_long else "failed" if a.error or not a.cut else "cut"
                o.error = a.error or (None if a.too_long or a.cut else "no answer")
                o.turn = o.answered + 1
                pos[j] = len(skeletons[j])
                if convs[j] and convs[j][-1]["role"] == "user":  # the unanswered question goes too
                    convs[j] = convs[j][:-1]
            else:
                convs[j].append({"role": "assistant", "content": a.text})
                o.answered += 1
                o.cut += a.cut
                pos[j] += 1
