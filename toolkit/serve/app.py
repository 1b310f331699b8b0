"""The OpenAI-compatible HTTP API over the batcher: /v1/chat/completions, /v1/completions (both streamed as
server-sent events the way OpenAI sends them, ending with `data: [DONE]`), /v1/models, /health, /metrics.

Each response's `usage` has the standard token counts plus `speculative`: this request's verify steps,
accepted draft tokens, τ and acceptance by draft position. Usage is read only once the engine is through with
the sequence (its last update says so), never while the engine thread may still add to it.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field, replace

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from toolkit.infer.sequence import Result, Sequence
from toolkit.infer.metrics import summarize
from toolkit.infer.sampling import SamplingParams
from toolkit.serve.batcher import Batcher
from toolkit.serve.defaults import SamplingDefaults
from toolkit.serve.protocol import ApiError, ChatRequest, CompletionRequest, validation_error
from toolkit.serve.text import ClientStops, TextStream

RELEASE_WAIT = 30.0  # seconds a reply cut at a stop string waits for the engine to let its sequence go


@dataclass
class Served:
    name: str            # the model name clients send and /v1/models lists
    tok: object          # tokenizer with the chat template
    stop_ids: frozenset  # end-of-turn tokens
    batcher: Batcher
    created: int = 0
    template_kwargs: dict = field(default_factory=dict)  # --default-chat-template-kwargs; a request's keys win
    defaults: SamplingDefaults = SamplingDefaults()  # what a request that names no temperature etc. gets


def through(result: Result, n: int) -> Result:
    """`result` as if generation had stopped at its n-th token, as the engine stops at a stop string: the verify
    steps that emitted tokens 2..n (the first comes from prefill), the last one's accepted count cut there."""
    accepted, emitted = [], min(len(result.tokens), 1)
    for a in result.accepted:
        if emitted >= n:
            break
        accepted.append(min(a, n - emitted - 1))
        emitted += accepted[-1] + 1
    return replace(result, tokens=result.tokens[:n], accepted=accepted, verify_steps=len(accepted),
                   from_lookup=min(result.from_lookup, sum(accepted)))  # per step it is not kept: a bound


def usage(seq: Sequence, positions: int = 0, upto: int | None = None) -> dict:
    """Token counts and this request's speculation figures; `positions`: the draft tree's depth (0: none);
    `upto`: the tokens through a stop string the reply was cut at (the engine may have generated on)."""
    result = seq.result if upto is None or upto >= len(seq.result.tokens) else through(seq.result, upto)
    s = summarize([result], positions=positions)
    n_prompt, n_out = len(seq.prompt), len(result.tokens)
    return {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out,
            "speculative": {"verify_steps": s["verify_steps"], "accepted_tokens": sum(result.accepted),
                            # null, not 0, when no verify step ran (the answer ended at prefill's token)
                            "tau": s["tau"] if s["verify_steps"] else None,
                            "accept_rate_by_position": s["accept_rate_by_position"],
                            "accepted_length_histogram": s["accepted_length_histogram"],
                            "accepted_from_lookup": s["accepted_from_lookup"]}}


def build_app(served: Served) -> FastAPI:
    app = FastAPI(title="toolkit serve", docs_url=None, redoc_url=None)
    batcher, tok = served.batcher, served.tok
    engine, metrics = batcher.engine, batcher.metrics
    positions = max(engine.tree.num_steps if engine.head is not None else 0,  # draft positions usage reports:
                    engine.lookup.num_tokens if engine.lookup is not None else 0)  # the tree's or lookup's depth
    served.created = served.created or int(time.time())

    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError):
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException):  # unknown paths, wrong methods
        return await api_error(request, ApiError(err.status_code, f"{request.method} {request.url.path}: "
                                                 f"{err.detail}", None, "not_found" if err.status_code == 404
                                                 else None))

    async def parse(request: Request, model):
        raw = await request.body()
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ApiError(400, f"malformed JSON body: {e}", None, "json_invalid") from None
        except RecursionError:  # arrays / objects nested thousands deep: the parser gives up (was a bare 500)
            raise ApiError(400, "malformed JSON body: nested too deeply", None, "json_invalid") from None
        if not isinstance(data, dict):
            raise ApiError(400, "the body must be a JSON object", None, "json_invalid")
        try:
            body = model.model_validate(data)
        except ValidationError as e:
            raise validation_error(e.errors()) from None
        if body.model is not None and body.model != served.name:
            raise ApiError(404, f"the model {body.model!r} does not exist; this server serves {served.name!r}",
                           "model", "model_not_found")
        return body

    def sequence(body, ids: list[int], field: str) -> Sequence:
        ctx = engine.max_len
        if len(ids) >= ctx:
            raise ApiError(400, f"the prompt is {len(ids)} tokens; this server's context (--max-seq-len) is {ctx} "
                                "tokens, which leaves no room to generate", field, "context_length_exceeded")
        d = served.defaults
        max_tokens = body.max_tokens if body.max_tokens is not None else min(ctx - len(ids), d.max_tokens or ctx)
        if len(ids) + max_tokens > ctx:  # named as the client sent it (chat: max_completion_tokens wins)
            name = "max_completion_tokens" if getattr(body, "max_completion_tokens", None) else "max_tokens"
            raise ApiError(400, f"{name} ({max_tokens}) + the prompt ({len(ids)} tokens) exceed this server's "
                                f"context of {ctx} tokens", name, "context_length_exceeded")
        params = SamplingParams(d.temperature if body.temperature is None else body.temperature,
                                d.top_p if body.top_p is None else body.top_p,
                                d.top_k if body.top_k is None else max(body.top_k, 0), max_tokens)
        gen = torch.Generator(device=engine.device)
        gen.manual_seed(body.seed) if body.seed is not None else gen.seed()
        # the engine stops where the client's text shows a stop string, not generating past what the reply cuts
        stops = ClientStops(tok, body.stop) if body.stop else None
        extra = set(body.stop_token_ids or [])
        if any(not 0 <= t < engine.target.config.vocab_size for t in extra):
            raise ApiError(400, f"stop_token_ids must be in 0..{engine.target.config.vocab_size - 1}", "stop_token_ids")
        # ignore_eos (vLLM's): generate max_tokens whatever the model says, as load benchmarks ask
        stop_ids = (frozenset() if body.ignore_eos else served.stop_ids) | frozenset(extra)
        return Sequence(ids, params, stop_ids, stops, gen)

    @app.get("/health")
    async def health():
        if not batcher.alive:
            return JSONResponse({"status": "engine thread stopped"}, status_code=503)
        return {"status": "ok", "running": len(engine.running), "waiting": len(batcher.waiting)}

    def model_card() -> dict:
        return {"id": served.name, "object": "model", "created": served.created, "owned_by": "toolkit",
                "max_model_len": engine.max_len}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")  # the OpenAI client's models.retrieve (an id may hold slashes)
    async def model(model_id: str):
        if model_id != served.name:
            raise ApiError(404, f"model {model_id!r} is not served here; this server serves {served.name!r}",
                           "model", "model_not_found")
        return model_card()

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await parse(request, ChatRequest)
        messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()}
                    for m in body.messages]
        try:
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                           **{**served.template_kwargs, **body.chat_template_kwargs})
        except Exception as e:  # a template may refuse a role order (e.g. no system turn)
            raise ApiError(400, f"the chat template refused these messages: {e}", "messages") from None
        seq = sequence(body, tok(text, add_special_tokens=body.add_special_tokens).input_ids, "messages")
        return await respond(request, body, seq, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await parse(request, CompletionRequest)
        if isinstance(body.prompt, str):
            ids = tok(body.prompt, add_special_tokens=body.add_special_tokens).input_ids
        elif any(not 0 <= t < engine.target.config.vocab_size for t in body.prompt):
            raise ApiError(400, f"prompt token ids must be in 0..{engine.target.config.vocab_size - 1}", "prompt")
        else:
            ids = list(body.prompt)
        return await respond(request, body, sequence(body, ids, "prompt"), chat=False)

    async def respond(request: Request, body, seq: Sequence, chat: bool):
        req = batcher.submit(seq)
        rid, now = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", int(time.time())
        kind = "chat.completion" if chat else "text_completion"
        stream = TextStream(tok, body.stop or [])

        def finish_reason() -> str:
            # the engine says why it stopped (its stop strings are matched in text decoded with special tokens,
            # the stream's without: a stop string that is a special token ends it only there)
            return "stop" if stream.stopped or seq.result.finish == "stop" else "length"

        def choice(text: str | None, reason: str | None, delta: bool) -> dict:
            if not chat:
                return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
            key = "delta" if delta else "message"
            msg = ({"content": text} if text is not None else {}) if delta else {"role": "assistant", "content": text}
            return {"index": 0, key: msg, "logprobs": None, "finish_reason": reason}

        generated: list[int] = []  # the updates carry new tokens only

        async def next_update() -> tuple[list[int], bool]:
            update = await req.updates.get()
            if update.error is not None:
                raise ApiError(500, update.error, None, "engine_error", "server_error")
            generated.extend(update.tokens)
            return generated, update.done

        async def let_go() -> None:
            """The text showed a stop string before the engine stopped (ClientStops makes that rare): cancel the
            sequence and wait until the engine has let it go. Usage read at once raced the engine thread, which
            was still adding tokens and steps; read after, it is final and `usage` cuts it at the stop."""
            batcher.cancel(req)
            done = False
            try:
                while not done:
                    _, done = await asyncio.wait_for(next_update(), timeout=RELEASE_WAIT)
            except (ApiError, asyncio.TimeoutError):  # a failed step lets go too; a stuck engine must not hang us
                pass

        if not body.stream:  # the same incremental text as a stream, so a stop string ends it there too
            done, parts, checked = False, [], time.monotonic()
            try:
                while not (done or stream.stopped):
                    try:
                        tokens, done = await asyncio.wait_for(next_update(), timeout=1.0)
                        parts.append(stream.update(tokens, done))
                    except asyncio.TimeoutError:
                        pass
                    # once a second whether tokens flow or not: every engine step posts an update, so a check
                    # made only when none came for a second never ran while a left request kept generating
                    if not done and time.monotonic() - checked >= 1.0:
                        checked = time.monotonic()
                        if await request.is_disconnected():
                            raise asyncio.CancelledError from None
            except asyncio.CancelledError:  # the client went away: free its row
                batcher.cancel(req)
                metrics.cancelled.inc()
                raise
            if not done:
                await let_go()
            return {"id": rid, "object": kind, "created": now, "model": served.name,
                    "choices": [choice("".join(parts), finish_reason(), False)],
                    "usage": usage(seq, positions, stream.stop_at)}

        def event(choices: list, **extra) -> str:
            data = {"id": rid, "object": f"{kind}.chunk" if chat else kind, "created": now, "model": served.name,
                    "choices": choices, **extra}
            return f"data: {json.dumps(data)}\n\n"

        async def events():
            finished = failed = done = False
            # with include_usage every chunk carries "usage": null but the last, which carries the counts (OpenAI)
            nulls = {"usage": None} if body.stream_options and body.stream_options.include_usage else {}
            try:
                if chat:
                    yield event([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                  "finish_reason": None}], **nulls)
                while not (finished or failed):
                    try:
                        tokens, done = await next_update()
                    except ApiError as err:  # the engine failed: say so, then end the stream
                        yield f"data: {json.dumps(err.body())}\n\n"
                        failed = True
                        break
                    delta = stream.update(tokens, done)
                    finished = done or stream.stopped
                    if delta:
                        yield event([choice(delta, None, True)], **nulls)
                if finished:
                    if not done:  # the update's word, not seq.done: that turns true before the step has ended
                        await let_go()
                    yield event([choice(None, finish_reason(), True)], **nulls)
                    if body.stream_options and body.stream_options.include_usage:
                        yield event([], usage=usage(seq, positions, stream.stop_at))
                yield "data: [DONE]\n\n"
            finally:
                if not (finished or failed):  # the client went away mid-stream: free its row
                    batcher.cancel(req)
                    metrics.cancelled.inc()

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    return app
