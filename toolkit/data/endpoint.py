"""`toolkit regenerate --endpoint URL [URL ...]`: the answers of OpenAI-compatible servers (vLLM, SGLang,
`toolkit serve`), one or many serving the same target.

One task per conversation asks its turns in order (turn k+1 after the server's own answer to turn k), and
`--concurrency` conversations run at once on each server, so each always has that many requests in flight; a
conversation goes to the server with the fewest queued, so a faster one takes more; conversations are handed back
as they finish. A request that fails after the client's retries fails its conversation only (it is reported and
retried by a rerun). A server that fails every one of many conversations in a row is dropped, and those
conversations and the ones queued on it are asked of the others; with none left the run stops. A reasoning
parser's `reasoning_content` is kept beside the answer (toolkit/data/samples.py renders it as the target wrote it).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from collections import deque
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from typing import Iterator

from toolkit.data.tools import split_tools
from toolkit.data.turns import Answer, Turns

# how vLLM, SGLang and OpenAI word a prompt (+ max_tokens) beyond the context: such a 400 ends the conversation
# at its answered turns, as a prompt over --max-len does in the engine; any other 400 is a failure with its reason
CONTEXT_ERROR = re.compile(r"context length|context window|maximum context|max_model_len|too long|longer than",
                           re.IGNORECASE)


def wire_messages(messages: list[dict]) -> tuple[list[dict], list[dict] | None]:
    """A conversation as the OpenAI API takes it: its tools apart, each call's arguments as JSON text with an id,
    and each tool turn naming the call it answers (in order, where the data named none: ShareGPT's)."""
    messages, tools = split_tools(messages)
    sent, pending = [], []
    for m in messages:
        if m.get("tool_calls"):
            calls = [{**c, "id": c.get("id") or f"call_{len(sent)}_{i}", "function": {
                **c["function"], "arguments": json.dumps(c["function"]["arguments"], ensure_ascii=False)}}
                for i, c in enumerate(m["tool_calls"])]
            m, pending = {**m, "tool_calls": calls}, [c["id"] for c in calls]
        elif m["role"] == "tool" and "tool_call_id" not in m and pending:
            m = {**m, "tool_call_id": pending[0]}
        if m["role"] == "tool" and m.get("tool_call_id") in pending:
            pending.remove(m["tool_call_id"])
        sent.append(m)
    return sent, tools


def request_seed(seed: int, cid: str, turn: int) -> int:
    """A seed per (run seed, conversation id, turn): vLLM gives each seeded request its own generator, so one
    seed for every request would make the samples of a conversation (--num-samples) identical."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{cid}:{turn}".encode()).digest()[:4], "big") & 0x7FFFFFFF


def read_choice(choice) -> Answer:
    """The answer of a chat completion choice: its content, and a reasoning parser's reasoning (`reasoning_content`,
    or vLLM's newer `reasoning`) kept apart, as the server split it."""
    msg = choice.message
    extra = msg.model_extra or {}
    reasoning = (getattr(msg, "reasoning_content", None) or extra.get("reasoning_content") or extra.get("reasoning")
                 or "").strip("\n")
    content = (msg.content or "").strip()
    cut = choice.finish_reason == "length"
    if not content:
        return Answer(cut=cut, error="no answer after the reasoning (it used up --max-new-tokens)" if reasoning
                      else "an empty answer")
    return Answer(content, reasoning=reasoning, cut=cut)


class Server:
    """One endpoint: its client and served model, its own pool of --concurrency threads, what is queued on it
    and the conversations it failed in a row (held back: asked of another server if it is dropped)."""

    def __init__(self, url: str, args):
        from openai import APIConnectionError, APIStatusError, OpenAI

        self.url, self.queued, self.finished, self.streak = url, 0, 0, []
        self.client = OpenAI(base_url=url, api_key=os.environ.get("OPENAI_API_KEY", "EMPTY"),
                             max_retries=args.max_retries, timeout=args.request_timeout)
        try:
            self.model = args.model or self.client.models.list().data[0].id
        except (APIConnectionError, APIStatusError, IndexError) as e:
            raise RuntimeError(f"--endpoint {url}: {type(e).__name__} ({str(e).splitlines()[0][:200]}); give the "
                               "base URL of a running OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1 "
                               "(answered conversations are kept; rerun to resume)") from None
        self.pool = ThreadPoolExecutor(args.concurrency)


def endpoint_runner(args):
    """-> run(todo) yielding ((id, source, skeleton), (conversation, Outcome)) as conversations finish."""
    from openai import APIConnectionError, APIStatusError, BadRequestError
    from tqdm import tqdm

    servers = [Server(url, args) for url in args.endpoint]
    models = sorted({s.model for s in servers})
    if len(models) > 1:  # one dataset, one target
        listed = ", ".join(f"{s.url}: {s.model}" for s in servers)
        raise ValueError(f"--endpoint: the servers list different models ({listed}); give servers of one target, "
                         "or name the served model with --model")
    extra_body = {"chat_template_kwargs": args.variables} if args.variables else None

    def ask(server: Server, cid: str, messages: list[dict]) -> Answer:
        options = {"max_tokens": args.max_new_tokens, "temperature": args.temperature}
        if args.top_p is not None:  # left out, the server's own default (a model's generation_config) applies
            options["top_p"] = args.top_p
        if args.seed is not None:
            options["seed"] = request_seed(args.seed, cid, sum(m["role"] == "user" for m in messages))
        if extra_body:
            options["extra_body"] = extra_body
        if "reasoning_effort" in args.variables:  # vLLM's gpt-oss prompt takes it from this field, not the kwargs
            options["reasoning_effort"] = args.variables["reasoning_effort"]
        try:
            messages, tools = wire_messages(messages)
            # the tools shown, none called: the target cannot run them, and a server answers tool_choice auto only
            # with its tool parser on (vLLM's --enable-auto-tool-choice)
            called = {"tools": tools, "tool_choice": "none"} if tools else {}
            r = server.client.chat.completions.create(model=server.model, messages=messages, **called, **options)
        except BadRequestError as e:
            reason = str(e.message).splitlines()[0][:300]
            return Answer(too_long=True) if CONTEXT_ERROR.search(reason) else Answer(error=f"HTTP 400: {reason}")
        except (APIConnectionError, APIStatusError) as e:  # after the client's --max-retries
            return Answer(error=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
        return read_choice(r.choices[0])

    def one(server: Server, item):
        cid, _, skeleton = item
        turns = Turns(skeleton, args.on_length)
        while (messages := turns.prompt()) is not None:  # turn k+1 after the server's own answer to turn k
            turns.answer(ask(server, cid, messages))
        return turns.conv, turns.outcome

    def run(todo: list) -> Iterator:
        # many conversations in a row failing with nothing answered: the server is down or refuses every request
        limit, depth = max(8, 2 * args.concurrency), 2 * args.concurrency
        live, pending, items, again = list(servers), {}, iter(todo), deque()

        def feed() -> None:  # at most 2 x concurrency queued per server: memory stays flat on any corpus
            while live:
                server = min(live, key=lambda s: s.queued)
                item = again.popleft() if again else next(items, None) if server.queued < depth else None
                if item is None:
                    return
                pending[server.pool.submit(one, server, item)] = item, server
                server.queued += 1

        try:
            feed()
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    item, server = pending.pop(future)
                    server.queued -= 1
                    if future.cancelled():  # queued on a dropped server: asked of another
                        continue
                    conv, outcome = future.result()
                    if outcome.stop == "failed" and outcome.answered == 0:
                        if server not in live:  # it was running when its server was dropped
                            again.append(item)
                            continue
                        server.streak.append((item, (conv, outcome)))
                    else:  # the server answers: the failures before were those conversations' own
                        yield from server.streak
                        server.streak.clear()
                        server.finished += 1
                        yield item, (conv, outcome)
                    if len(server.streak) < limit or server not in live:
                        continue
                    live.remove(server)
                    last = server.streak[-1][1][1].error
                    if not live:
                        yield from (f for s in servers for f in s.streak)
                        raise RuntimeError(f"--endpoint {server.url}: the last {limit} conversations all failed "
                                           f"(the last: {last}); stopped (answered conversations are kept, "
                                           "failures listed beside --out; fix the cause and rerun to resume)")
                    tqdm.write(f"regenerate: --endpoint {server.url} dropped: the last {limit} conversations all "
                               f"failed (the last: {last}); they and those queued on it go to the {len(live)} "
                               "other(s)", file=sys.stderr)  # above the progress bar, not into it
                    again.extend(i for i, _ in server.streak)
                    server.streak.clear()
                    for f, (i, s) in pending.items():
                        if s is server and f.cancel():
                            again.append(i)
                feed()
            yield from (f for s in servers for f in s.streak)  # failures at the end of the run
        finally:
            for s in servers:
                s.pool.shutdown(wait=False, cancel_futures=True)
            if len(servers) > 1:
                tqdm.write("regenerate: conversations finished per endpoint: "
                           + ", ".join(f"{s.url} {s.finished}" for s in servers), file=sys.stderr)

    return run
