"""`toolkit prepare-data`: conversations -> the target's chat template -> input_ids + loss_mask, saved as a
`datasets` folder (docs/formats.md section 9) that training reads.

    toolkit prepare-data --data regen.jsonl --out data/prepared --max-len 2048

loss_mask is 1 exactly on assistant tokens and the end-of-turn token that closes each assistant turn, found
from the rendered template through character offsets (no per-model regex). Multi-turn conversations stay
whole, except where the template rewrites answers (Qwen3 drops an earlier answer's thinking, DeepSeek-R1 every
answer's): those give one sample per answer (counted as per_turn; toolkit/data/samples.py). Longer samples are
truncated to --max-len (counted). Samples left with no assistant token are dropped.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from toolkit.data.schemas import CUT, BadRecord, ReadStats, read_places
from toolkit.data.tokenize_pool import TokenizePool
from toolkit.embedded import DEFAULT_MODEL


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help=f"target whose tokenizer and template are used (default "
                                                 f"{DEFAULT_MODEL})")
    p.add_argument("--tokenizer", default=None, help="a tokenizer.json or folder instead of the model's")
    p.add_argument("--chat-template", default=None, help="built-in name (llama3|qwen2|chatml|chatml-tools) or a .jinja file")
    p.add_argument("--chat-template-kwargs", default=None,
                   help='extra template variables, as regenerate and serve were given them, e.g. '
                        '\'{"reasoning_effort": "low"}\' (gpt-oss: the system message the target read)')
    p.add_argument("--data", nargs="+", required=True, help="conversation files (any corpus schema)")
    p.add_argument("--out", required=True, help="output datasets folder")
    p.add_argument("--max-len", type=int, default=2048, help="tokens per sample; longer ones are truncated")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    p.add_argument("--num-proc", type=int, default=1, metavar="N",
                   help="processes rendering and tokenizing (SpecForge's build-dataset-num-proc); the rows and "
                        "their order are the same for any N")


def tokenize(renderer, convs: list[list[dict]], max_len: int) -> tuple[list[dict], dict]:
    """Rendered, tokenized and masked samples (`index` = position in convs, `turn` = the assistant turn a
    per-turn sample ends with, else 0) plus counts (truncated, no_assistant, bad, per_turn; refusal: the first
    conversation's refusal by the chat template or its record, None without one)."""
    counts = {"truncated": 0, "no_assistant": 0, "bad": 0, "per_turn": 0, "refusal": None}
    texts, all_spans, index = [], [], []
    for i, conv in enumerate(convs):
        try:
            samples = renderer.render_samples(conv)
        except BadRecord as e:  # e.g. a template that takes no system turn (Gemma, Mistral): said at the end
            counts["bad"] += 1
            counts["refusal"] = counts["refusal"] or str(e)
            continue
        counts["per_turn"] += len(samples) > 1  # one sample per answer (data/samples.py)
        cut = [bool(m.get(CUT)) for m in conv if m["role"] == "assistant"]  # a span per answer, or the sample's
        for turn, (text, spans) in enumerate(samples, 1):
            texts.append(text)
            all_spans.append((spans, cut if len(samples) == 1 else cut[turn - 1:turn]))
            index.append((i, turn if len(samples) > 1 else 0))
    rows = []
    if not texts:
        return rows, counts
    enc = renderer.tok(texts, add_special_tokens=False, return_offsets_mapping=True)
    for (i, turn), ids, offsets, (spans, cut) in zip(index, enc["input_ids"], enc["offset_mapping"], all_spans):
        mask = renderer.assistant_mask(ids, offsets, spans, cut)
        if len(ids) > max_len:
            counts["truncated"] += 1
            ids, mask = ids[:max_len], mask[:max_len]
        if not any(mask):
            counts["no_assistant"] += 1
            continue
        rows.append({"input_ids": ids, "loss_mask": mask, "num_tokens": len(ids), "index": i, "turn": turn})
    return rows, counts


def main(args: argparse.Namespace) -> int:
    import datasets

    from toolkit.atomic import check_out_path, write_text
    from toolkit.data.chat import ChatRenderer
    from toolkit.data.tokenizer import load_tokenizer, template_kwargs
    from toolkit.models import fingerprint, resolve_target

    if args.max_len < 2:
        raise ValueError(f"--max-len {args.max_len}: give at least 2 tokens")
    if not 1 <= args.num_proc <= 1024:
        raise ValueError(f"--num-proc {args.num_proc}: give a number of processes from 1 to 1024")
    variables = template_kwargs(args.chat_template_kwargs)
    out = Path(args.out)
    check_out_path("--out", out, folder=True)  # a file there or above it failed only after the tokenizing
    if out.exists() and not args.overwrite:
        raise ValueError(f"--out {out} exists; pass --overwrite to replace it")
    if out.is_dir() and any(out.iterdir()) and not (out / "toolkit_prepare.json").is_file():
        raise ValueError(f"--out {out} holds files and is not a prepare-data output (no toolkit_prepare.json): "
                         "--overwrite replaces only one; give a new folder")
    folder = None if args.tokenizer else resolve_target(args.model or DEFAULT_MODEL)
    tok = load_tokenizer(model=str(folder) if folder else None, tokenizer=args.tokenizer,
                         chat_template=args.chat_template)
    renderer = ChatRenderer(tok, variables)
    refused = []  # the first conversation the chat template (or its record) refused, said at the end
    totals = {"samples": 0, "kept": 0, "tokens": 0, "assistant_tokens": 0, "truncated": 0, "no_assistant": 0,
              "bad": 0, "plain_text": 0, "per_turn": 0}

    def rows():
        pool = TokenizePool(renderer, args.max_len, args.num_proc)
        for f in args.data:
            stats, batch, sources = ReadStats(f), [], []
            for place, sample in read_places(f, stats):
                totals["samples"] += 1
                if isinstance(sample, str):
                    totals["plain_text"] += 1
                    continue
                batch.append(sample)
                sources.append(place)
                if len(batch) == 1000:
                    for done, tag in pool.submit(batch, sources):
                        yield from flush(done, tag)
                    batch, sources = [], []
            if batch:
                for done, tag in pool.submit(batch, sources):
                    yield from flush(done, tag)
            totals["bad"] += stats.bad
            stats.warn_bad()
        for done, tag in pool.finish():
            yield from flush(done, tag)

    def flush(done, sources):
        kept, counts = done
        refused[:] = refused or ([counts["refusal"]] if counts["refusal"] else [])
        counts.pop("refusal")
        for k, v in counts.items():
            totals[k] += v
        for r in kept:
            totals["kept"] += 1
            totals["tokens"] += r["num_tokens"]
            totals["assistant_tokens"] += sum(r["loss_mask"])
            source, turn = sources[r.pop("index")], r.pop("turn")
            yield {**r, "source": f"{source} turn {turn}" if turn else source}

    features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32")),
                                  "loss_mask": datasets.Sequence(datasets.Value("int8")),
                                  "num_tokens": datasets.Value("int32"), "source": datasets.Value("string")})
    def no_data() -> ValueError:
        cut = totals["truncated"] and totals["no_assistant"]
        return ValueError(f"--data {' '.join(args.data)}: no sample with assistant tokens ({totals}); "
                          + (f"{totals['bad']} refused, the first: {refused[0]}" if refused else
                             f"--max-len {args.max_len} cut the answers off: raise it" if cut else
                             "give conversations with assistant turns"))

    out.parent.mkdir(parents=True, exist_ok=True)
    # the rows are staged beside --out, not in $TMPDIR: a small or in-memory /tmp failed a big corpus at its end
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.prepare-", dir=out.parent) as cache:
        try:
            ds = datasets.Dataset.from_generator(rows, features=features, cache_dir=cache)
        except datasets.exceptions.DatasetGenerationError as err:  # it wraps what reading --data raised
            if isinstance(err.__cause__, (ValueError, FileNotFoundError, RuntimeError)):
                raise err.__cause__ from None
            raise
        except ValueError as err:  # datasets refuses a generator that yields nothing
            if totals["kept"] == 0:
                raise no_data() from None
            raise err
        if len(ds) == 0:
            raise no_data()
        tmp = out.with_name(f".{out.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        ds.save_to_disk(str(tmp))
    meta = {"format_version": 1, "target": None if args.tokenizer else args.model or DEFAULT_MODEL,
            "tokenizer": args.tokenizer, "target_fingerprint": fingerprint(folder) if folder else None,
            "chat_template": tok.chat_template, "chat_template_kwargs": variables, "max_len": args.max_len,
            "data": args.data, **totals}
    write_text(tmp / "toolkit_prepare.json", json.dumps(meta, indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    print(f"prepare-data: {totals['kept']} samples, {totals['tokens']} tokens ({totals['assistant_tokens']} "
          f"assistant) -> {out}; truncated {totals['truncated']}, without assistant tokens "
          f"{totals['no_assistant']}, broken {totals['bad']}"
          + (f", plain text {totals['plain_text']} (skipped: a draft trains on chat turns, whose template and "
             "assistant mask plain text lacks; build-token-map counts it)" if totals["plain_text"] else "")
          + (f", {totals['per_turn']} conversations one sample per answer (the template rewrites earlier answers)"
             if totals["per_turn"] else "") + (f"; the first refused: {refused[0]}" if refused else ""),
          file=sys.stderr)
    return 0
