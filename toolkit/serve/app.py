"""The OpenAI-compatible HTTP API over the batcher: /v1/chat/completions, /v1/completions (both streamed as
server-sent events the way OpenAI sends them, ending with `data: [DONE]`), /v1/responses and Anthropic's
/v1/messages (each served as the chat request it amounts to: responses.py, anthropic.py), OpenAI's /v1/files and
/v1/batches and Anthropic's /v1/messages/batches (file_store.py, batch_jobs.py, anthropic_batches.py: a batch's
requests run through these same routes), SGLang's native /generate, /get_server_info, /flush_cache, ... (sglang_generate.py, sglang_info.py), /v1/models, /health, /metrics, and
vLLM's /tokenize, /detokenize and /tokenizer_info (tokenize.py), /ping and /version. A request becomes one engine
sequence per choice (sequences.py, its constraint compiled by structured.py: a format, or a tool choice of tools.py),
answered whole or as a stream by reply.py, each choice read by choice.py.

Each response's `usage` has the standard token counts plus `speculative`: this request's verify steps,
accepted draft tokens, τ and acceptance by draft position. Usage is read only once the engine is through with
the sequence (its last update says so), never while the engine thread may still add to it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from toolkit.infer.sequence import Sequence
from toolkit.serve.anthropic import add_messages_routes, anthropic_error, messages_path
from toolkit.serve.anthropic_batches import add_message_batches_routes
from toolkit.serve.api_error import ApiError, validation_error
from toolkit.serve.batch_jobs import Jobs, add_batches_routes
from toolkit.serve.batcher import Batcher
from toolkit.serve.choice import Choice
from toolkit.serve.defaults import SamplingDefaults
from toolkit.serve.file_store import FileStore, add_files_routes
from toolkit.serve.json_body import read_object, validated
from toolkit.serve.metrics import draft_positions
from toolkit.serve.protocol import ChatRequest, CompletionRequest
from toolkit.serve.reasoning import TAGS as REASONING_TAGS
from toolkit.serve.reply import ClientGone, Reply
from toolkit.serve.response_store import add_responses_routes
from toolkit.serve.sequences import Sequences
from toolkit.serve.sglang_generate import add_generate_route
from toolkit.serve.sglang_info import add_sglang_info_routes
from toolkit.serve.structured import Compiler
from toolkit.serve.text import shown_ids
from toolkit.serve.tokenize import add_tokenizer_routes
from toolkit.serve.tool_calls import TAGS
from toolkit.serve.tools import template_turn

@dataclass
class Served:
    name: str            # the model name clients send and /v1/models lists
    tok: object          # tokenizer with the chat template
    stop_ids: frozenset  # end-of-turn tokens
    batcher: Batcher
    created: int = 0
    template_kwargs: dict = field(default_factory=dict)  # --default-chat-template-kwargs; a request's keys win
    defaults: SamplingDefaults = SamplingDefaults()  # what a request that names no temperature etc. gets
    reasoning_parser: str | None = None  # --reasoning-parser: chat replies' thinking split out (reasoning.py)
    tool_parser: str | None = None  # --tool-call-parser with --enable-auto-tool-choice: tool_choice auto read with it
    aliases: tuple = ()  # more names requests may send (--served-model-name A B ...); replies name `name`

    @property
    def names(self) -> tuple:
        return (self.name, *self.aliases)

    def __post_init__(self):
        if self.tool_parser == "openai" and self.reasoning_parser != "gpt_oss":  # its calls are read by that split
            raise ValueError("tool parser openai (gpt-oss's harmony calls) needs reasoning parser gpt_oss")


def build_app(served: Served) -> FastAPI:
    app = FastAPI(title="toolkit serve", docs_url=None, redoc_url=None)
    batcher, tok = served.batcher, served.tok
    engine, metrics = batcher.engine, batcher.metrics
    positions = draft_positions(engine)  # the draft positions usage reports, as /metrics' per-position series
    served.created = served.created or int(time.time())
    # the parser's tags that are special tokens here: kept in the text it reads (vLLM turns skip_special_tokens off)
    tags = shown_ids(tok, TAGS[served.tool_parser]) if served.tool_parser else frozenset()
    thinking_tags = shown_ids(tok, REASONING_TAGS.get(served.reasoning_parser, ()))  # harmony's headers

    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError):
        if messages_path(request.url.path):  # the anthropic client reads its own shape
            return anthropic_error(err)
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, err: ClientGone):  # normal traffic: not an error with a traceback
        return Response(status_code=499)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException):  # unknown paths, wrong methods
        return await api_error(request, ApiError(err.status_code, f"{request.method} {request.url.path}: "
                                                 f"{err.detail}", None, "not_found" if err.status_code == 404
                                                 else None))

    @app.exception_handler(RequestValidationError)
    async def bad_query(request: Request, err: RequestValidationError):  # a query parameter of the wrong type
        return await api_error(request, validation_error(err.errors()))

    async def parse(request: Request, model):
        body = validated(model, await read_object(request))
        if body.model is not None and body.model not in served.names:
            raise ApiError(404, f"the model {body.model!r} does not exist; this server serves "
                                f"{' or '.join(map(repr, served.names))}",
                           "model", "model_not_found")
        return body

    sequence = Sequences(served, engine)  # a request's choice -> an engine sequence (sequences.py)
    compile_constraint = Compiler(tok, engine.target.config.vocab_size)  # its constraint, compiled (structured.py)

    @app.get("/health")
    async def health():
        if not batcher.alive:
            return JSONResponse({"status": "engine thread stopped"}, status_code=503)
        return {"status": "ok", "running": len(engine.running), "waiting": len(batcher.waiting)}

    @app.api_route("/ping", methods=["GET", "POST"])  # vLLM's (SageMaker's health check): /health's answer
    async def ping():
        return await health()

    @app.get("/version")  # vLLM's
    async def version():
        from toolkit import __version__

        return {"version": __version__}

    def model_card(name: str) -> dict:
        return {"id": name, "object": "model", "created": served.created, "owned_by": "toolkit",
                "max_model_len": engine.max_len, "root": served.name}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card(n) for n in served.names]}

    @app.get("/v1/models/{model_id:path}")  # the OpenAI client's models.retrieve (an id may hold slashes)
    async def model(model_id: str):
        if model_id not in served.names:
            raise ApiError(404, f"model {model_id!r} is not served here; this server serves "
                                f"{' or '.join(map(repr, served.names))}", "model", "model_not_found")
        return model_card(model_id)

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=metrics.content_type)

    def check_n(body, prompts: int = 1) -> None:
        if body.n * prompts > batcher.max_queue:  # each choice is a sequence of its own: all must fit the queue
            what = f"n ({body.n})" if prompts == 1 else f"{prompts} prompts x n ({body.n})"
            raise ApiError(400, f"{what} exceeds what this server queues at once (--max-queue {batcher.max_queue}); "
                                "ask for fewer choices per request", "n" if prompts == 1 else "prompt")

    def chat_text(messages: list, template_kwargs: dict, add_generation_prompt: bool = True,
                  continue_final_message: bool = False, tools: list | None = None) -> str:
        """The served chat template over request messages (and tools), a request's template variables over the
        server's; continue_final_message: the last (assistant) message left open for the reply to go on from."""
        turns = [template_turn(m) for m in messages]
        try:
            return tok.apply_chat_template(turns, tokenize=False, add_generation_prompt=add_generation_prompt,
                                           continue_final_message=continue_final_message, tools=tools or None,
                                           **{**served.template_kwargs, **template_kwargs})
        except Exception as e:  # a template may refuse a role order (e.g. no system turn)
            raise ApiError(400, f"the chat template refused these messages: {e}", "messages") from None

    add_tokenizer_routes(app, parse, tok, chat_text, engine.target.config.vocab_size, engine.max_len)

    def prompt_ids(body: ChatRequest) -> tuple[list[int], str]:
        """A chat request's prompt: token ids and text."""
        text = chat_text(body.messages, body.chat_template_kwargs, body.add_generation_prompt,
                         body.continue_final_message, body.tools)
        return tok(text, add_special_tokens=body.add_special_tokens).input_ids, text

    async def chat_sequences(body: ChatRequest) -> tuple[list[Sequence], str, tuple | None, frozenset]:
        """A chat request's choices as engine sequences; its prompt text, how the replies are read for tool calls
        (ToolCallReader's arguments, or None) and the special ids their text keeps."""
        check_n(body)
        choice = body.tool
        if choice.mode == "auto" and served.tool_parser is None:  # vLLM's refusal: no parser to read the reply
            raise ApiError(400, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be '
                                'set (tools without tool_choice mean auto); send tool_choice "none", "required" or '
                                "a named function, or start the server with them", "tool_choice")
        ids, text = prompt_ids(body)
        compiled = await compile_constraint(body)
        if compiled is not None and served.reasoning_parser == "gpt_oss":  # its answer starts a few tokens in
            raise ApiError(400, "structured output (response_format, guided decoding, a required or named tool "
                                "choice) is not supported with --reasoning-parser gpt_oss: the harmony reply's "
                                "final message starts after its analysis and headers", "response_format")
        mode = served.tool_parser if choice.mode == "auto" else None if choice.mode == "none" else choice.mode
        keep = (tags if choice.mode == "auto" else frozenset()) | thinking_tags
        seqs = [sequence(body, ids, "messages", i, compiled, keep) for i in range(body.n)]
        return seqs, text, (mode, choice.name, choice.parallel) if mode else None, keep

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await parse(request, ChatRequest)
        seqs, text, tools, keep = await chat_sequences(body)
        return await respond(request, body, seqs, [text], chat=True, tools=tools, keep=keep)

    async def completion_sequences(body: CompletionRequest) -> tuple[list[Sequence], list[str]]:
        """A completions request's choices as engine sequences (prompt i's are i * n .. i * n + n - 1, vLLM's order),
        and its prompts' texts."""
        prompts, texts, seqs = body.prompts(), [], []
        check_n(body, len(prompts))
        compiled = await compile_constraint(body)
        for prompt in prompts:
            if isinstance(prompt, str):
                ids = tok(prompt, add_special_tokens=body.add_special_tokens).input_ids
            elif any(not 0 <= t < engine.target.config.vocab_size for t in prompt):
                raise ApiError(400, f"prompt token ids must be in 0..{engine.target.config.vocab_size - 1}", "prompt")
            else:
                ids = list(prompt)
            # seeded seed + j as if alone: a prompt's reply does not depend on the batch it came in
            seqs += [sequence(body, ids, "prompt", j, compiled) for j in range(body.n)]
            texts.append(prompt if isinstance(prompt, str) else tok.decode(ids))  # as vLLM: special tokens shown
        return seqs, texts

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await parse(request, CompletionRequest)
        seqs, texts = await completion_sequences(body)
        return await respond(request, body, seqs, texts, chat=False)

    def queued(body, seqs: list[Sequence], prompts: list[str], chat: bool, tools: tuple | None = None,
               keep=frozenset()) -> Reply:
        """`seqs` queued, and the reply that reads them: `seqs` the choices' sequences, n per prompt; `prompts`: the
        prompts' texts (echo sends them); `tools`: how the replies are read for tool calls (ToolCallReader's
        arguments), `keep`: special ids their text shows."""
        reqs = batcher.submit_all(seqs)  # one engine sequence per choice (n of them), queued together or not at all
        echo = getattr(body, "echo", False)
        # vLLM fills a completion's prompt_logprobs with echo's figures too; chat carries them once, at the top
        prompt_top = None if chat else body.prompt_logprobs if body.prompt_logprobs is not None else (
            body.logprobs if echo else None)
        own_ids = frozenset(body.stop_token_ids or ()) - served.stop_ids  # stop_reason names these, not end-of-turn
        choices = [Choice(i, req, batcher, tok, body.stop or [], chat, prompts[i // body.n] if echo else None,
                          prompt_top, own_ids, silent=body.max_tokens == 0,
                          reasoning=served.reasoning_parser if chat else None, tools=tools, keep=keep,
                          ids=bool(body.return_token_ids), as_ids=bool(body.return_tokens_as_token_ids))
                   for i, req in enumerate(reqs)]
        return Reply(choices, body, chat, served.name, batcher, positions)

    async def respond(request: Request, body, seqs: list[Sequence], prompts: list[str], chat: bool,
                      tools: tuple | None = None, keep=frozenset()):
        reply = queued(body, seqs, prompts, chat, tools, keep)
        if not body.stream:
            whole = await reply.whole(request)
            if chat:  # vLLM's: one prompt, so once for the response (null when not asked)
                whole["prompt_logprobs"] = None if body.prompt_logprobs is None else reply.choices[0].write.vllm_prompt(
                    seqs[0].result.prompt_logprobs, body.prompt_logprobs)
                if body.return_token_ids:
                    whole["prompt_token_ids"] = list(seqs[0].prompt)
            return whole
        return reply.streaming()

    add_responses_routes(app, parse, chat_sequences, queued, lambda body: prompt_ids(body)[0],  # response_store.py
                         served.name)
    add_messages_routes(app, parse, chat_sequences, queued, lambda body: prompt_ids(body)[0], served.name)
    files = FileStore()
    add_files_routes(app, files)  # file_store.py: uploads and batch outputs, in memory
    jobs = Jobs(app, files, engine.max_batch)  # batch_jobs.py: a job's requests go through this app
    add_batches_routes(app, jobs)
    add_message_batches_routes(app, jobs)  # anthropic_batches.py
    add_generate_route(app, completion_sequences, queued, engine)  # sglang_generate.py: SGLang's /generate
    add_sglang_info_routes(app, served, engine, batcher)  # sglang_info.py
    return app
