"""`toolkit regenerate`: replace every assistant turn of a corpus with the target's own answer, turn by turn
(on-policy data, as the EAGLE-3 paper trains on). Turn k+1 sees the target's answer to turn k.

    toolkit regenerate --data train.jsonl --out regen.jsonl --max-new-tokens 256
    toolkit regenerate --data train.jsonl --out regen_1.jsonl --shard 1/2 --done regen.jsonl  # a 2nd process
    toolkit regenerate --data train.jsonl --out regen.jsonl --endpoint http://127.0.0.1:8000/v1 --model NAME
    toolkit regenerate --data train.jsonl --out regen.jsonl --endpoint http://node1:8000/v1 http://node2:8000/v1

Answers come from our engine (batched, in-process: in_process.py) or from any OpenAI-compatible endpoint
(vLLM, SGLang, `toolkit serve`: endpoint.py). The output is JSONL in the OpenAI chat schema, one line per
finished conversation: {"id", "source", "messages"}. A line is written only when its conversation is done, so a
killed run resumes from the file (a torn last line is cut off) with no duplicate and no gap. A conversation
whose prompt outgrows the context keeps the turns answered before; one that fails (a server error after retries,
a template that refuses it, an empty answer) is not written, but listed in OUT.errors.jsonl, and a rerun asks it
again.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

from toolkit.cpu_speed import threads_problem
from toolkit.data.regen_worklist import conversations, done_ids, parse_shard
from toolkit.data.tools import split_tools
from toolkit.data.turns import ON_LENGTH
from toolkit.embedded import DEFAULT_MODEL
from toolkit.seeds import seed_arg


def add_args(p: argparse.ArgumentParser) -> None:
    from toolkit.infer.loading import add_device_args

    p.add_argument("--model", default=None, help=f"target folder/alias/hub id (default {DEFAULT_MODEL}); with "
                                                 "--endpoint, the served model name (default: the first listed)")
    p.add_argument("--data", nargs="+", required=True, help="conversation files (any corpus schema)")
    p.add_argument("--out", required=True, help="output JSONL; an existing file is resumed")
    p.add_argument("--endpoint", nargs="+", default=None, metavar="URL",
                   help="OpenAI-compatible base URL(s), e.g. http://127.0.0.1:8000/v1 (API key from $OPENAI_API_KEY); "
                        "several servers of one target share the conversations")
    p.add_argument("--max-new-tokens", type=int, default=512, help="per assistant turn")
    p.add_argument("--chat-template-kwargs", default=None, metavar="JSON",
                   help='extra template variables, e.g. \'{"enable_thinking": false}\' (Qwen3: answers without '
                        "thinking); sent to --endpoint as chat_template_kwargs, as vLLM / SGLang read them")
    p.add_argument("--chat-template", default=None, metavar="NAME|FILE",
                   help="the in-process engine's chat template over the target's (a built-in name, e.g. chatml-tools "
                        "for tool conversations, or a .jinja file); a server applies its own (vLLM / SGLang "
                        "--chat-template), so it is refused with --endpoint")
    p.add_argument("--on-length", choices=ON_LENGTH, default="keep",
                   help="an answer cut at --max-new-tokens: keep it (as SpecForge does), or drop it and the turns "
                        "after it; either way the summary counts them")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass (engine default 1; an endpoint "
                                                             "is sent none, so its own default applies)")
    p.add_argument("--num-samples", type=int, default=1, help="answers per conversation (needs temperature > 0)")
    p.add_argument("--seed", type=seed_arg, default=None, help="sampling seed (engine default 0); an endpoint gets one "
                                                          "per conversation and turn derived from it, none without")
    p.add_argument("--limit", type=int, default=None, help="first N conversations only")
    p.add_argument("--shard", default="0/1", metavar="K/N",
                   help="answer only conversations whose index %% N == K (run N processes or machines, each "
                        "with its own --out; ids stay global, so `cat` joins the outputs)")
    p.add_argument("--done", nargs="*", default=[], metavar="FILE",
                   help="other outputs whose ids count as answered (e.g. a shard's or an earlier run's file)")
    p.add_argument("--batch-size", type=int, default=16, help="conversations decoded together (engine)")
    p.add_argument("--concurrency", type=int, default=16, help="conversations in flight per endpoint, each asking "
                                                                  "its turns in order")
    p.add_argument("--max-retries", type=int, default=5, help="retries of a failed request (endpoint: connection "
                                                              "errors, 429, 5xx), with backoff")
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request (endpoint)")
    p.add_argument("--max-len", type=int, default=2048, help="prompt + answer tokens per turn (engine)")
    add_device_args(p, "bfloat16 on a CPU with native bf16 answers ~1.5x as fast, as the target served in bf16 "
                       "would; the in-process engine's, refused with --endpoint")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")


def main(args: argparse.Namespace) -> int:
    if args.num_samples < 1 or (args.num_samples > 1 and args.temperature <= 0):
        raise ValueError(f"--num-samples {args.num_samples}: give 1, or more with --temperature > 0 "
                         f"(greedy answers would be identical)")
    if args.max_new_tokens < 1 or args.batch_size < 1 or args.concurrency < 1:
        raise ValueError("--max-new-tokens, --batch-size and --concurrency must be at least 1")
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit {args.limit}: give at least 1 conversation (or leave it out for all)")
    if args.max_len < 2:
        raise ValueError(f"--max-len {args.max_len}: give prompt + answer tokens per turn, at least 2")
    if args.max_new_tokens >= args.max_len and not args.endpoint:  # every prompt would be "beyond the context"
        raise ValueError(f"--max-new-tokens {args.max_new_tokens} leaves no room for a prompt in --max-len "
                         f"{args.max_len} (prompt + answer tokens per turn); raise --max-len or lower --max-new-tokens")
    if problem := threads_problem(args.threads):
        raise ValueError(problem)
    if not 0 <= args.temperature < float("inf"):
        raise ValueError(f"--temperature {args.temperature}: give a finite number >= 0 (0 = greedy)")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise ValueError(f"--top-p {args.top_p}: give a nucleus mass in (0, 1]")
    if args.max_retries < 0 or not 0 < args.request_timeout < float("inf"):
        raise ValueError(f"--max-retries {args.max_retries} / --request-timeout {args.request_timeout}: give retries "
                         ">= 0 and a finite timeout > 0 seconds")
    from toolkit.data.tokenizer import template_kwargs

    args.variables = template_kwargs(args.chat_template_kwargs)
    for url in args.endpoint or []:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--endpoint {url}: give the server's base URL, e.g. http://127.0.0.1:8000/v1")
    if args.endpoint and len(set(args.endpoint)) < len(args.endpoint):
        raise ValueError(f"--endpoint {' '.join(args.endpoint)}: a URL given twice; give each server once (it gets "
                         "--concurrency conversations at a time)")
    if args.endpoint and (args.device, args.dtype) != ("auto", "auto"):
        raise ValueError(f"--device {args.device} / --dtype {args.dtype} set the in-process engine; with --endpoint "
                         "the server answers with its own settings: drop them (or drop --endpoint)")
    if args.endpoint and args.chat_template is not None:
        raise ValueError(f"--chat-template {args.chat_template} sets the in-process engine's template; a server "
                         "renders with its own: start it with that template (vLLM / SGLang --chat-template), or drop "
                         "--endpoint")
    from toolkit.data.tokenizer import check_template_name

    check_template_name(args.chat_template)  # a bad one fails here, before loading
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    out = Path(args.out)
    from toolkit.atomic import check_out_path

    check_out_path("--out", out, folder=False)
    if out.exists() and any(Path(f).exists() and out.samefile(f) for f in args.data):
        raise ValueError(f"--out {out} is one of the --data files: the answers would be appended to the input; "
                         "give a new file")
    out.parent.mkdir(parents=True, exist_ok=True)
    k, n = parse_shard(args.shard)
    done = done_ids(out)
    for f in args.done:
        if not Path(f).exists():
            raise ValueError(f"--done {f}: no such file")
        done |= done_ids(Path(f), repair=False)
    names = {Path(f).name for f in args.data}  # an id is "file name:index": a resume's ids are of these files
    if other := next((i for i in sorted(done) if i.rsplit(":", 1)[0] not in names), None):
        raise ValueError(f"--out {out}{' / --done' if args.done else ''} holds answers to other data (id {other!r}, "
                         f"not of {', '.join(sorted(names))}): give a new --out for this --data, or the --data it "
                         "was written from")
    mine = [c for i, c in enumerate(conversations(args.data, args.num_samples, args.limit)) if i % n == k]
    todo = [c for c in mine if c[0] not in done and None in c[2]]  # None: a user turn to answer
    asking = sum(None not in c[2] for c in mine)
    if not todo and not done:
        raise ValueError(f"--data {' '.join(args.data)}: no conversations with user turns found")
    where = " and ".join([str(out)] + args.done)
    print(f"regenerate: {len(done)} conversations already in {where}, {len(todo)} to answer"
          + (f" (shard {k}/{n})" if n > 1 else "")
          + (f"; {asking} without a user turn left out" if asking else ""), file=sys.stderr)
    if not todo:
        return 0
    if args.endpoint:
        from toolkit.data.endpoint import endpoint_runner

        run = endpoint_runner(args)
    else:
        from toolkit.data.in_process import engine_runner

        run = engine_runner(args)
    from tqdm import tqdm

    errors = out.with_name(out.name + ".errors.jsonl")  # this run's failures (a rerun asks them again)
    errors.unlink(missing_ok=True)
    start, synced, counts, last_error = time.perf_counter(), time.monotonic(), Counter(), None
    with open(out, "a", encoding="utf-8") as fh, tqdm(total=len(todo), unit="conv", desc="regenerate") as bar:
        try:
            for (cid, source, _), (conv, outcome) in run(todo):
                counts[outcome.stop or "whole"] += 1
                counts["cut answers"] += outcome.cut
                if outcome.stop == "failed":  # not written: a rerun asks it again
                    last_error = outcome.error
                    with open(errors, "a", encoding="utf-8") as ef:
                        ef.write(json.dumps({"id": cid, "source": source, "turn": outcome.turn,
                                             "error": outcome.error}, ensure_ascii=False) + "\n")
                elif outcome.answered:
                    conv, tools = split_tools(conv)
                    fh.write(json.dumps({"id": cid, "source": source, "messages": conv,
                                         **({"tools": tools} if tools else {})}, ensure_ascii=False) + "\n")
                    counts["written"] += 1
                bar.update(1)
                if time.monotonic() - synced > 2:  # a killed run loses at most ~2 s of answers
                    fh.flush()
                    os.fsync(fh.fileno())
                    synced = time.monotonic()
        finally:
            fh.flush()
            os.fsync(fh.fileno())
            bar.close()  # its last line first, then the summary below it (not glued to it)
            print(summary(counts, out, errors, time.perf_counter() - start, args), file=sys.stderr)
    if counts["failed"] == len(todo) and not done:  # nothing ever answered: the setup is at fault, not a conversation
        where = f"--endpoint {' '.join(args.endpoint)}" if args.endpoint else f"--model {args.model or DEFAULT_MODEL}"
        raise RuntimeError(f"{where}: {last_error}; every one of the {len(todo)} conversations failed (listed in "
                           f"{errors})")
    return 1 if counts["failed"] else 0  # some failed: a rerun asks them again


def summary(counts: Counter, out: Path, errors: Path, seconds: float, args) -> str:
    parts = [f"regenerate: wrote {counts['written']} conversations to {out} in {seconds:.0f} s"]
    if counts["too long"]:
        parts.append(f"{counts['too long']} ended early at a prompt beyond the context (--max-len with the engine; "
                     "kept up to there, none when at the first turn)")
    if counts["cut answers"]:
        parts.append(f"{counts['cut answers']} answers cut at --max-new-tokens {args.max_new_tokens} kept "
                     "(--on-length drop drops them)")
    if counts["cut"]:
        parts.append(f"{counts['cut']} ended before an answer cut at --max-new-tokens {args.max_new_tokens} "
                     "(--on-length drop)")
    if counts["failed"]:
        parts.append(f"{counts['failed']} FAILED, not written (reasons in {errors}; a rerun asks them again)")
    return "; ".join(parts)
