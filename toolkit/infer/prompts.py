"""Benchmark prompts: MT-bench `turns` records or any corpus schema, split into shards, answered turn by turn
with the chat template (turn 2 sees the model's own turn-1 answer). Shared by `toolkit bench`, transformers'
reference runs and the benchmark scripts; the answers written back as FastChat model answers."""
from __future__ import annotations

import sys
import time
import uuid
from collections import Counter
from pathlib import Path

from toolkit.data.harmony import reply_text
from toolkit.data.corpus_files import raw_records
from toolkit.data.schemas import ReadStats, surrogate, to_samples
from toolkit.infer.metrics import summarize


def parse_shard(text: str | None) -> tuple[int, int]:
    """'I/N' -> (I, N) with 0 <= I < N; None -> (0, 1), every prompt."""
    from toolkit.split import parse_split

    return (0, 1) if text is None else parse_split(text, "--shard", "0/10 for prompts 0, 10, 20, ...")


def read_prompts(path: str, limit: int | None, shard: tuple[int, int] = (0, 1),
                 template_kwargs: dict | None = None) -> list[dict]:
    """[{id, category, system, turns: [user texts], template_kwargs}] from MT-bench `turns` records or any corpus
    schema (template_kwargs: extra chat-template variables every turn is asked with, e.g. enable_thinking); with
    `shard` (I, N) only the records I, I+N, I+2N, ... of the file. id: the record's `question_id`, else its
    0-based place in the file (not in the shard), so that the shards of one file never share an id."""
    if not Path(path).is_file():
        what = "a folder, not a file" if Path(path).is_dir() else "no such file"
        raise ValueError(f"--prompts {path}: {what} (give a .jsonl of MT-bench `turns` records or of any "
                         "chat schema docs/formats.md section 1 lists, e.g. examples/prompts.jsonl)")
    out, stats = [], ReadStats(path)
    for index, (where, rec) in enumerate(raw_records(Path(path), stats)):
        if index % shard[1] != shard[0]:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("turns"), list):
            item = {"id": rec.get("question_id", index), "category": _category(rec, where),
                    "system": None, "turns": list(rec["turns"])}
        else:
            try:
                conv = to_samples(rec)[0]
            except ValueError as e:  # BadRecord / SchemaError say what is wrong, not where
                raise ValueError(f"{where}: {e}") from None
            if isinstance(conv, str):
                raise ValueError(f"{where}: plain text is not a prompt; give chat records")
            system = next((m["content"] for m in conv if m["role"] == "system"), None)
            known = isinstance(rec, dict) and rec.get("question_id") is not None
            item = {"id": rec["question_id"] if known else index,
                    "category": _category(rec, where) if isinstance(rec, dict) else "all",
                    "system": system, "turns": [m["content"] for m in conv if m["role"] == "user"]}
        if not item["turns"] or not all(isinstance(t, str) and t for t in item["turns"]):
            raise ValueError(f"{where}: turns must be a non-empty list of non-empty strings (the user turns)")
        if bad := next(filter(None, map(surrogate, item["turns"])), None):
            raise ValueError(f"{where}: a turn holds {bad}")
        out.append({**item, "template_kwargs": dict(template_kwargs or {})})
        if limit is not None and len(out) >= limit:
            break
    if stats.bad:  # a benchmark over fewer prompts than its file holds would say nothing of the missing ones
        raise ValueError(f"--prompts {path}: {stats.bad} unreadable record(s), e.g. {stats.bad_examples[0]}; "
                         "fix or remove them")
    if not out:
        raise ValueError(f"--prompts {path}: no prompts read" + (f" in shard {shard[0]}/{shard[1]}"
                                                                 if shard[1] > 1 else ""))
    if repeated := [i for i, n in Counter(p["id"] for p in out).items() if n > 1]:  # FastChat's judge pairs answers by question_id
        print(f"WARNING: --prompts {path}: question_id {repeated[0]!r} and {len(repeated) - 1} other(s) name more "
              "than one prompt: --answers records sharing an id cannot be told apart by a judge", file=sys.stderr)
    return out


def _category(rec: dict, where: str) -> str:
    """A record's `category` as the name its τ is grouped under: missing or null is "all", a number its text."""
    cat = rec.get("category")
    if cat is None:
        return "all"
    if isinstance(cat, bool) or not isinstance(cat, (str, int, float)):
        raise ValueError(f"{where}: category {cat!r} is not a name; give a string (e.g. \"writing\") or leave it out")
    return str(cat)


def answer_turns(tok, prompts, generate) -> list[list[str]]:
    """Answer every prompt turn by turn (turn 2 sees the model's own turn-1 answer); `generate(prompt ids,
    prompt) -> generated ids` is the engine under test, and its prompt carries `turn` (1, 2, ...)."""
    answers = []
    for p in prompts:
        messages = [{"role": "system", "content": p["system"]}] if p["system"] else []
        texts = []
        for number, turn in enumerate(p["turns"], 1):
            messages.append({"role": "user", "content": turn})
            ids = tok(prompt_text(tok, p, messages), add_special_tokens=False).input_ids
            out = generate(ids, {**p, "turn": number})
            texts.append(reply_text(tok, out))  # gpt-oss: the final channel's text, not its headers
            messages.append({"role": "assistant", "content": texts[-1]})
        answers.append(texts)
    return answers


def prompt_text(tok, p: dict, messages: list[dict] | None = None) -> str:
    """What the target reads for `messages` of prompt `p` (its first turn, with its system message, when not
    given): the chat template with the prompt's template variables."""
    if messages is None:
        messages = [{"role": "system", "content": p["system"]}] if p.get("system") else []
        messages.append({"role": "user", "content": p["turns"][0]})
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **p.get("template_kwargs", {}))


def warm_up_ids(tok, prompts) -> list[int]:
    """The first turn of the first prompt, as it is benched: each engine generates a few tokens from it before
    it is timed, so first-call initialisation is not counted against one of them."""
    return tok(prompt_text(tok, prompts[0]), add_special_tokens=False).input_ids


def answer_records(prompts, answers, results, model_id: str) -> list[dict]:
    """FastChat llm_judge's model-answer records (one per prompt: question_id, answer_id, model_id,
    choices[0].turns, tstamp), so `gen_judgment.py` grades them as they are; `category` and each turn's
    speculative figures are added. `results` are the engine's, one per turn in answering order."""
    turns = iter(results)
    records = []
    for p, texts in zip(prompts, answers):
        spec = []
        for _ in texts:
            r = next(turns)
            s = summarize([r])  # τ defined once (metrics.py); null, not 0, where no verify step ran
            spec.append({"tokens": s["tokens"], "verify_steps": s["verify_steps"], "accepted_tokens": sum(r.accepted),
                         "tau": s["tau"] if s["verify_steps"] else None, "finish": r.finish})
        records.append({"question_id": p["id"], "answer_id": uuid.uuid4().hex, "model_id": model_id,
                        "category": p["category"], "choices": [{"index": 0, "turns": texts}],
                        "speculative": spec, "tstamp": time.time()})
    return records
