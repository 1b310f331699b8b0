"""Which conversations `toolkit regenerate` answers: every chat sample of the corpus files as a skeleton with a
slot where each answer goes, the shard's share of them, less the ones an output file already holds (a killed
run resumes from it; its torn last line is cut off)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from toolkit.data.schemas import TOOLS, ReadStats, read_places
from toolkit.data.tools import split_tools


def conversations(files: list[str], num_samples: int, limit: int | None) -> Iterator[tuple[str, str, list]]:
    """(id, source, [system/user messages, with None where an answer goes]) for every chat sample; an id is the
    file's name and the sample's index, so files of one run must have different names. MT-bench `turns` are one
    conversation: each turn is answered after the model's own answer to the one before."""
    names = [Path(f).name for f in files]
    twice = sorted({x for x in names if names.count(x) > 1})
    if twice:
        raise ValueError(f"--data files share the name(s) {twice}: a conversation's id is file name:index, so "
                         "their ids would collide (and a resume would skip one's conversations); rename or copy one")
    n = 0
    for f in files:
        stats = ReadStats(f)
        for i, (place, sample) in enumerate(read_places(f, stats, joined_turns=True)):
            if isinstance(sample, str):
                continue  # plain text has no turns to answer
            if limit is not None and n >= limit:
                return
            n += 1
            skeleton = answer_slots(sample)
            for k in range(num_samples):
                yield f"{Path(f).name}:{i}" + (f"/{k}" if num_samples > 1 else ""), place, skeleton
        stats.warn_bad()


def answer_slots(conv: list[dict]) -> list:
    """The conversation with None where the target answers: each written answer's place once a user turn (or tool
    results) came before it, and after a user turn (or tool results) that nothing answers. An assistant turn that
    calls tools stays as written, with the results that follow it: the target cannot run the tools, so what it
    answers next reads those results. The tool definitions stay on the first message kept."""
    conv, tools = split_tools(conv)
    skeleton, asked = [], False
    for i, m in enumerate(conv):
        if m["role"] == "assistant" and not m.get("tool_calls"):
            if asked and skeleton[-1] is not None:
                skeleton.append(None)
            continue
        skeleton.append(m)
        asked = asked or m["role"] in ("user", "tool")
        after = conv[i + 1]["role"] if i + 1 < len(conv) else None
        if m["role"] == "user" and after != "assistant" or m["role"] == "tool" and after not in ("assistant", "tool"):
            skeleton.append(None)
    if tools and skeleton and skeleton[0] is not None:
        skeleton[0] = {**skeleton[0], TOOLS: tools}
    return skeleton


def parse_shard(text: str) -> tuple[int, int]:
    """'K/N' -> (K, N) with 0 <= K < N."""
    from toolkit.split import parse_split

    return parse_split(text, "--shard", "0/2 and 1/2 for two processes")


def done_ids(out: Path, repair: bool = True) -> set[str]:
    """Ids already written, read line by line (memory stays flat on a large output). A torn last line (killed
    mid-write) is ignored, and with repair (our own --out) cut off so appending stays valid JSONL; another
    process's file (--done) is only read."""
    if not out.exists():
        return set()
    flag = "--out" if repair else "--done"
    if out.is_dir():
        raise ValueError(f"{flag} {out} is a folder; give the JSONL file regenerate writes")
    ids, end, torn = set(), 0, b""
    with open(out, "rb") as fh:  # read before any repair: a file not ours stays whole
        for n, line in enumerate(fh, 1):
            if not line.endswith(b"\n"):
                torn = line
                break
            end += len(line)
            if line.strip():
                try:
                    ids.add(json.loads(line)["id"])
                except (ValueError, KeyError, TypeError):
                    raise ValueError(f"{flag} {out}: line {n} is not a record regenerate wrote (JSON with an id); "
                                     "give a regenerate output, or a new file for --out") from None
    if repair and torn:
        start = b'{"id": '  # how every line we write begins
        if not (torn.startswith(start) or start.startswith(torn[:len(start)])):  # a JSON array, another tool's
            raise ValueError(f"--out {out}: its last line is not the start of a record regenerate wrote; give a "
                             "regenerate output to resume, or a new file")
        with open(out, "r+b") as fh:
            fh.truncate(end)
    return ids
