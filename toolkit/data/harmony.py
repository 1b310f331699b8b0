"""OpenAI's harmony chat format (gpt-oss): a reply is messages

    [<|start|>assistant]<|channel|>NAME[ to=RECIPIENT][<|constrain|>...]<|message|>BODY<|end|>

the last one ended by <|return|> (the turn's end) or <|call|> (a tool call); channel analysis is the model's
reasoning, final the answer, commentary preambles and tool calls. The tags are special tokens: a decode that
drops special tokens runs the headers into the text ("analysisUser asks...assistantfinal4."), so the reply is read
with them kept. Used by `serve --reasoning-parser gpt_oss` (toolkit/serve/reasoning.py) and for the answer text
of bench's multi-turn prompts (reply_text) and in-process regeneration (reply_parts: the analysis kept apart).
"""
from __future__ import annotations

import json

from toolkit.held import held

CHANNEL, MESSAGE, ENDS = "<|channel|>", "<|message|>", ("<|end|>", "<|call|>", "<|return|>")
HARMONY_TAGS = ("<|start|>", CHANNEL, MESSAGE, "<|constrain|>", "<|end|>")  # what a reply's text must keep


def is_harmony(tok) -> bool:
    """Whether `tok` writes the harmony format (its vocabulary has <|channel|> and <|return|>)."""
    vocab = tok.get_vocab()
    return CHANNEL in vocab and "<|return|>" in vocab


def reply_text(tok, tokens: list[int]) -> str:
    """A generated turn's text as a chat template takes a past assistant turn (the analysis is not re-read)."""
    return reply_parts(tok, tokens)[1]


def reply_parts(tok, tokens: list[int]) -> tuple[str, str]:
    """A generated turn as (reasoning, text), special tokens left out: from a harmony tokenizer the analysis
    channel's bodies and the final (and commentary) channels' text; from any other ("", all of it)."""
    if not is_harmony(tok):
        return "", tok.decode(tokens, skip_special_tokens=True)
    from toolkit.data.tokenizer import special_ids

    keep = {tok.convert_tokens_to_ids(t) for t in HARMONY_TAGS}
    hidden = frozenset(special_ids(tok)) - keep
    tokens = [int(t) for t in tokens]  # a tensor's elements (transformers' generate) hash by identity, not value
    text = tok.decode([t for t in tokens if t not in hidden], skip_special_tokens=False)
    return HarmonySplit().feed(text, done=True)


class HarmonySplit:
    """gpt-oss's harmony messages: analysis bodies -> reasoning, the other channels' -> content, headers dropped;
    two messages of one part are joined by a line break (as vLLM joins them). With `calls`, a message addressed to
    a function (`to=functions.NAME`, in its header before or after the channel) is a tool call: (NAME, its body,
    the arguments: JSON re-written compactly as the other parsers write it, else as written) goes to `found` once
    the message ends, and nothing of it to the content."""

    OPENS = ("<|", "to=")  # how a header starts (the reply's first one may name its recipient before its channel)

    def __init__(self, calls: bool = False):
        self.phase = "header"  # header (up to <|message|>) or body (up to an end tag)
        self.channel = "final"
        self.pending = ""
        self.calls, self.to, self.args = calls, None, ""  # the function the body in hand is addressed to
        self.found: list[tuple[str, str]] = []             # tool calls read, not yet taken (take_calls)
        self.said = {"reasoning": False, "content": False}  # a part's text given out: the next message's starts
        self.fresh = False                                  # with a line break (the body in hand has none yet)

    def take_calls(self) -> list[tuple[str, str]]:
        found, self.found = self.found, []
        return found

    def feed(self, text: str, done: bool = False) -> tuple[str, str]:
        self.pending += text
        parts = {"reasoning": "", "content": ""}
        while self.pending:
            if self.phase == "header":
                head = self.pending.lstrip()
                at = self.pending.find(MESSAGE)
                opened = head.startswith(self.OPENS) or (not done and any(o.startswith(head) for o in self.OPENS))
                if head and not opened or (done and at < 0 and "<|" not in head):  # no header: plain content
                    self.phase, self.channel, self.to, self.fresh = "body", "final", None, False
                    continue
                if at < 0:
                    if done:
                        self.pending = ""  # a header cut off by max_tokens: nothing of the answer
                    break
                header = self.pending[:at]
                named = header.rsplit(CHANNEL, 1)[1].split() if CHANNEL in header else []
                self.channel = named[0].split("<|")[0] if named else "final"
                to = next((w[3:].split("<|")[0] for w in header.replace("<|", " <|").split() if w.startswith("to=")),
                          "")
                self.to = to.removeprefix("functions.") if self.calls and to.startswith("functions.") else None
                self.pending, self.phase, self.fresh = self.pending[at + len(MESSAGE):], "body", True
                continue
            ends = [(i, tag) for tag in ENDS if (i := self.pending.find(tag)) >= 0]
            cut, tag = min(ends) if ends else (len(self.pending), "")
            if not ends and not done:  # a tail that may still become an end tag waits
                cut -= max(held(self.pending, t) for t in ENDS)
            if self.to is not None:  # a call's arguments: given whole once the message ends
                self.args += self.pending[:cut]
                if tag:
                    self._call()
            elif cut > 0:
                part = "reasoning" if self.channel == "analysis" else "content"
                parts[part] += ("\n" if self.fresh and self.said[part] else "") + self.pending[:cut]
                self.said[part], self.fresh = True, False
            self.pending = self.pending[cut + len(tag):]
            if not tag:
                break
            self.phase = "header"
        if done and self.to is not None:  # the reply ended in a call (at <|call|>, a stop token the text lacks)
            self._call()
        return parts["reasoning"], parts["content"]

    def _call(self) -> None:
        args = self.args.strip()
        try:
            args = json.dumps(json.loads(args), ensure_ascii=False)
        except json.JSONDecodeError:
            pass  # not JSON (cut by max_tokens, or the model's slip): as written, as vLLM passes it on
        self.found.append((self.to, args))
        self.to, self.args = None, ""
