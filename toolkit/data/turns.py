"""Answering a conversation's turns in order, shared by `toolkit regenerate`'s engine and endpoint modes: turn
k+1 is asked after the target's own answer to turn k, and a turn that gets no answer ends the conversation
at the turns answered before it, with the reason kept."""
from __future__ import annotations

from dataclasses import dataclass

from toolkit.data.schemas import CUT, REASONING, bare

ON_LENGTH = ("keep", "drop")  # an answer cut at --max-new-tokens: kept as it is, or the conversation ends before it


@dataclass
class Answer:
    """One turn's answer, or why there is none."""
    text: str | None = None
    reasoning: str = ""        # a reasoning parser's reasoning (gpt-oss: the analysis channel), kept apart
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


class Turns:
    """One conversation being answered: `prompt()` gives the messages up to its next open turn (None when it is
    done), `answer(a)` records that turn's answer or ends the conversation at the turns answered before."""

    def __init__(self, skeleton: list, on_length: str = "keep"):
        self.skeleton, self.on_length, self.pos = skeleton, on_length, 0
        self.conv: list[dict] = []
        self.outcome = Outcome()

    def prompt(self) -> list[dict] | None:
        sk = self.skeleton
        while self.pos < len(sk) and sk[self.pos] is not None:
            self.conv.append(sk[self.pos])
            self.pos += 1
        return [bare(m) for m in self.conv] if self.pos < len(sk) else None  # past reasoning is not re-read

    def answer(self, a: Answer) -> None:
        o = self.outcome
        if a.text is None or (a.cut and self.on_length == "drop"):
            o.stop = "too long" if a.too_long else "failed" if a.error or not a.cut else "cut"
            o.error = a.error or (None if a.too_long or a.cut else "no answer")
            o.turn = o.answered + 1
            self.pos = len(self.skeleton)
            if self.conv and self.conv[-1]["role"] == "user":  # the unanswered question goes too
                self.conv = self.conv[:-1]
        else:
            self.conv.append({"role": "assistant", "content": a.text, **({REASONING: a.reasoning} if a.reasoning
                                                                         else {}), **({CUT: True} if a.cut else {})})
            o.answered += 1
            o.cut += a.cut
            self.pos += 1

