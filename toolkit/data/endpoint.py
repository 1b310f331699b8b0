"""`toolkit regenerate --endpoint URL`: the answers of any OpenAI-compatible server (vLLM, SGLang, `toolkit serve`).

One task per conversation asks its turns in order (turn k+1 after the server's own answer to turn k), and
`--concurrency` conversations run at once, so the server always has that many requests in flight; conversations
are handed back as they finish. A request that fails after the client's retries fails its conversation only
(it is reported and retried by a rerun); a server that fails every one of many conversations in a row stops the
run. A reasoning parser's `reasoning_content` is folded back into the answer as the target wrote it.
"""
from __future__ import annotations

import hashlib
import os
import re
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from typing import Iterator

from toolkit.data.turns import Answer, Turns

# how vLLM, SGLang and OpenAI word a prompt (+ max_tokens) beyond the context: such a 400 ends the conversation
# at its answered turns, as a prompt over --max-len does in the engine; any other 400 is a failure with its reason
CONTEXT_ERROR = re.compile(r"context length|context window|maximum context|max_model_len|too long|longer than",
                           re.IGNORECASE)


def request_seed(seed: int, cid: str, turn: int) -> int:
    """A seed per (run seed, conversation id, turn): vLLM gives each seeded request its own generator, so one
    seed for every request would make the samples of a conversation (--num-samples) identical."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{cid}:{turn}".encode()).digest()[:4], "big") & 0x7FFFFFFF


def read_choice(choice) -> Answer:
    """The answer text of a chat completion choice: a reasoning parser's reasoning (`reasoning_content`, or
    vLLM's newer `reasoning`) goes back in front of the content as the template renders it."""
    msg = choice.message
    extra = msg.model_extra or {}
    reasoning = (getattr(msg, "reasoning_content", None) or extra.get("reasoning_content") or extra.get("reasoning")
                 or "").strip("\n")
    content = (msg.content or "").strip()
    cut = choice.finish_reason == "length"
    if not content:
        return Answer(cut=cut, error="no answer after the reasoning (it used up --max-new-tokens)" if reasoning
                      else "an empty answer")
    return Answer(f"<think>\n{reasoning}\n</think>\n\n{content}" if reasoning else content, cut=cut)


def endpoint_runner(args):
    """-> run(todo) yielding ((id, source, skeleton), (conversation, Outcome)) as conversations finish."""
    from openai import APIConnectionError, APIStatusError, BadRequestError, OpenAI

    client = OpenAI(base_url=args.endpoint, api_key=os.environ.get("OPENAI_API_KEY", "EMPTY"),
                    max_retries=args.max_retries, timeout=args.request_timeout)

    def unreachable(what: str) -> RuntimeError:
        return RuntimeError(f"--endpoint {args.endpoint}: {what}; give the base URL of a running OpenAI-compatible "
                            "server, e.g. http://127.0.0.1:8000/v1 (answered conversations are kept; rerun to resume)")

    try:
        model = args.model or client.models.list().data[0].id
    except (APIConnectionError, APIStatusError, IndexError) as e:
        raise unreachable(f"{type(e).__name__} ({str(e).splitlines()[0][:200]})") from None
    extra_body = {"chat_template_kwargs": args.variables} if args.variables else None

    def ask(cid: str, messages: list[dict]) -> Answer:
        options = {"max_tokens": args.max_new_tokens, "temperature": args.temperature}
        if args.top_p is not None:  # left out, the server's own default (a model's generation_config) applies
            options["top_p"] = args.top_p
        if args.seed is not None:
            options["seed"] = request_seed(args.seed, cid, sum(m["role"] == "user" for m in messages))
        if extra_body:
            options["extra_body"] = extra_body
        try:
            r = client.chat.completions.create(model=model, messages=messages, **options)
        except BadRequestError as e:
            reason = str(e.message).splitlines()[0][:300]
            return Answer(too_long=True) if CONTEXT_ERROR.search(reason) else Answer(error=f"HTTP 400: {reason}")
        except (APIConnectionError, APIStatusError) as e:  # after the client's --max-retries
            return Answer(error=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
        return read_choice(r.choices[0])

    def one(item):
        cid, _, skeleton = item
        turns = Turns(skeleton, args.on_length)
        while (messages := turns.prompt()) is not None:  # turn k+1 after the server's own answer to turn k
            turns.answer(ask(cid, messages))
        return turns.conv, turns.outcome

    def run(todo: list) -> Iterator:
        # many conversations in a row failing with nothing answered: the server is down or refuses every request
        limit, in_a_row, last = max(8, 2 * args.concurrency), 0, ""
        pool, pending, items = ThreadPoolExecutor(args.concurrency), {}, iter(todo)
        try:
            for item in items:  # at most 2 x concurrency conversations queued: memory stays flat on any corpus
                pending[pool.submit(one, item)] = item
                if len(pending) >= 2 * args.concurrency:
                    break
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    item = pending.pop(future)
                    conv, outcome = future.result()
                    failed = outcome.stop == "failed" and outcome.answered == 0
                    in_a_row, last = (in_a_row + 1, outcome.error) if failed else (0, last)
                    yield item, (conv, outcome)
                    if in_a_row >= limit:
                        raise RuntimeError(f"--endpoint {args.endpoint}: the last {in_a_row} conversations all failed "
                                           f"(the last: {last}); stopped (answered conversations are kept, failures "
                                           "listed beside --out; fix the cause and rerun to resume)")
                    nxt = next(items, None)
                    if nxt is not None:
                        pending[pool.submit(one, nxt)] = nxt
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    return run
