"""Corpus records of the common schemas read into samples: a conversation (list of {role, content}) or plain text.

Records: see SCHEMAS (files are read by corpus_files.py). Broken records (wrong value types, an unknown role,
invalid Unicode) are counted in ReadStats and skipped; a record whose keys match no schema stops the run with the
file, line, keys seen and the schemas accepted, since it means the whole file is of a kind we do not read.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Union

Conversation = list  # [{"role": "system"|"user"|"assistant"|"tool", "content": str, "reasoning_content"?: str,
#                        "tool_calls"?: [...], "tool_call_id"?: str, "name"?: str}, ...]; tools: see TOOLS
Sample = Union[Conversation, str]
REASONING = "reasoning_content"  # an answer's reasoning, apart from its content (toolkit/data/samples.py renders it)
# where records keep it: OpenAI-compatible servers' reasoning parsers and Qwen3's template, vLLM's newer name,
# gpt-oss's template
REASONING_KEYS = (REASONING, "reasoning", "thinking")
# an answer the target did not finish (cut at --max-new-tokens: `toolkit regenerate`): trained on, but its
# template-added end-of-turn token is not, since the target never wrote one there (prepare.py)
CUT = "truncated"
# a conversation's tool definitions ride on its first message under this key (every rendered prefix keeps that
# message), taken off there by the renderer and passed to the template as `tools` (tools.py)
TOOLS = "toolkit_tools"

SCHEMAS = (
    "OpenAI chat: {messages: [{role, content, reasoning_content? (or reasoning, thinking), tool_calls?, "
    "tool_call_id?}], tools?}",
    "ShareGPT: {conversations: [{from, value}], tools?} (from function_call / observation: a tool call and its "
    "result)",
    "Alpaca: {instruction, input?, output} or seed tasks {instruction, instances: [{input, output}]}",
    "GPTeacher: {instruction, input?, response}",
    "Q&A: {question, answer}",
    "MT-bench: {turns: [str, ...]} (user turns only)",
    "plain text: {text} or a .txt file",
)
ROLES = {"system": "system", "developer": "system", "user": "user", "human": "user", "assistant": "assistant",
         "gpt": "assistant", "chatgpt": "assistant", "bard": "assistant", "bing": "assistant", "model": "assistant",
         "tool": "tool", "ipython": "tool", "function": "tool", "observation": "tool",
         "function_call": "assistant"}
FILE_KINDS = ".jsonl, .json, .txt, .parquet, or a `datasets` folder saved with save_to_disk"


class SchemaError(ValueError):
    """A file or record of a kind we do not read; the message names the place and what is accepted."""


class BadRecord(ValueError):
    """One record that is broken (counted and skipped)."""


@dataclass
class ReadStats:
    path: str
    records: int = 0
    samples: int = 0
    bad: int = 0
    bad_examples: list[str] = field(default_factory=list)

    def add_bad(self, where: str, why: str) -> None:
        self.bad += 1
        if len(self.bad_examples) < 5:
            self.bad_examples.append(f"{where}: {why}")

    def warn_bad(self, file=None) -> None:
        """One line on stderr (or `file`) when records were skipped: how many, and the first three's places and why."""
        if self.bad:
            print(f"warning: {self.path}: {self.bad} bad record(s) skipped, e.g. {'; '.join(self.bad_examples[:3])}",
                  file=file or sys.stderr)


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise BadRecord(f"{what} should be a string, got {type(value).__name__}")
    if bad := surrogate(value):
        raise BadRecord(f"{what} holds {bad}")
    return value


def surrogate(text: str) -> str | None:
    """What is wrong with text that JSON's \\uD800-style escapes made invalid Unicode (an unpaired surrogate, which
    no tokenizer encodes), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"an unpaired surrogate ({text[e.start]!r} at character {e.start}), not valid Unicode"
    return None


def template_reasoning(turn: dict, thought: str) -> dict:
    """`turn` with its reasoning under both names chat templates read it by (Qwen3's reasoning_content, gpt-oss's
    thinking), each template taking the one it knows; `turn` unchanged when there is none."""
    return {**turn, REASONING: thought, "thinking": thought} if thought else turn


def bare(msg: dict) -> dict:
    """A message without its reasoning (or cut mark): how a later turn's prompt holds an earlier answer (servers and
    templates drop the reasoning of past turns) and what a server is sent."""
    return {k: v for k, v in msg.items() if k not in (REASONING, CUT)}


def _user_prompt(instruction: Any, extra: Any) -> str:
    instruction = _text(instruction, "instruction")
    extra = _text(extra, "input") if extra not in (None, "") else ""
    return f"{instruction}\n\n{extra}" if extra else instruction


def to_samples(rec: Any, joined_turns: bool = False) -> list[Sample]:
    """One record -> its samples. Raises SchemaError for unknown key sets, BadRecord for broken values.
    joined_turns: MT-bench `turns` as one conversation of consecutive user turns (regeneration answers each
    after the model's own answer to the one before), not one prompt per turn."""
    if not isinstance(rec, dict):
        raise BadRecord(f"a record should be a JSON object, got {type(rec).__name__}")
    if "messages" in rec or "conversations" in rec:
        from toolkit.data.tools import TOOL_ROLES, tool_definitions, tool_message

        turns = rec.get("messages", rec.get("conversations"))
        if not isinstance(turns, list) or not turns:
            raise BadRecord("messages/conversations should be a non-empty list")
        conv = []
        for t in turns:
            if not isinstance(t, dict):
                raise BadRecord("each message should be an object")
            role = t.get("role", t.get("from"))
            if not isinstance(role, str) or role not in ROLES:
                raise BadRecord(f"unsupported role {role!r}; accepted: {sorted(ROLES)}")
            conv.append(tool_message(t, role, ROLES[role]) if role in TOOL_ROLES or t.get("tool_calls") else
                        {"role": ROLES[role], "content": _text(t.get("content", t.get("value")), "content")})
            thought = next((t[k] for k in REASONING_KEYS if t.get(k) is not None), "")
            if conv[-1]["role"] == "assistant" and _text(thought, "an answer's reasoning").strip():
                conv[-1][REASONING] = thought
            if conv[-1]["role"] == "assistant" and t.get(CUT) is True:
                conv[-1][CUT] = True
        if rec.get("tools") not in (None, "") and (tools := tool_definitions(rec["tools"])):  # "[]": none
            conv[0] = {**conv[0], TOOLS: tools}
        return [conv]
    if "instruction" in rec and "instances" in rec:
        if not isinstance(rec["instances"], list) or not all(isinstance(i, dict) for i in rec["instances"]):
            raise BadRecord("instances should be a list of objects")
        return [[{"role": "user", "content": _user_prompt(rec["instruction"], i.get("input"))},
                 {"role": "assistant", "content": _text(i.get("output"), "output")}] for i in rec["instances"]]
    if "instruction" in rec and ("output" in rec or "response" in rec):
        answer = rec["output"] if "output" in rec else rec["response"]
        return [[{"role": "user", "content": _user_prompt(rec["instruction"], rec.get("input"))},
                 {"role": "assistant", "content": _text(answer, "output/response")}]]
    if "question" in rec and "answer" in rec:
        return [[{"role": "user", "content": _text(rec["question"], "question")},
                 {"role": "assistant", "content": _text(rec["answer"], "answer")}]]
    if "turns" in rec:
        if not isinstance(rec["turns"], list):
            raise BadRecord("turns should be a list of strings")
        if joined_turns:
            return [[{"role": "user", "content": _text(t, "turn")} for t in rec["turns"]]] if rec["turns"] else []
        # Questions with no answers: each turn is its own one-message prompt (strict templates refuse
        # two user messages in a row).
        return [[{"role": "user", "content": _text(t, "turn")}] for t in rec["turns"]]
    if "text" in rec:
        return [_text(rec["text"], "text")]
    raise SchemaError(f"keys {sorted(rec)} match no schema we read; accepted: " + "; ".join(SCHEMAS))


def read_samples(path: str | Path, stats: ReadStats | None = None) -> Iterator[Sample]:
    """Yield the samples of one file, counting records and bad lines into `stats`."""
    for _, sample in read_places(path, stats):
        yield sample


def read_places(path: str | Path, stats: ReadStats | None = None, joined_turns: bool = False
                ) -> Iterator[tuple[str, Sample]]:
    """read_samples with each sample's place: `file:line` (`[item k]` in a JSON array), `#j` after it for the
    j-th sample of a record that holds several (an instruction's instances, MT-bench turns)."""
    from toolkit.data.corpus_files import raw_records

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"data file not found: {path}")
    stats = stats if stats is not None else ReadStats(str(path))
    for where, rec in raw_records(path, stats):
        stats.records += 1
        try:
            samples = to_samples(rec, joined_turns)
        except BadRecord as e:
            stats.add_bad(where, str(e))
            continue
        except SchemaError as e:
            raise SchemaError(f"{where}: {e}") from None
        stats.samples += len(samples)
        for j, sample in enumerate(samples):
            yield (where if len(samples) == 1 else f"{where}#{j}"), sample
    if stats.samples == 0 and stats.bad > 0:
        raise SchemaError(f"{path}: all {stats.bad} records are broken, e.g. " + "; ".join(stats.bad_examples))
