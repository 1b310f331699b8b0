"""vLLM's tokenizer endpoints: POST /tokenize (a prompt, or chat messages through the served chat template, to token
ids), POST /detokenize (ids to text) and GET /tokenizer_info (special tokens, chat template, context length).
lm-evaluation-harness's `local-completions` tokenizes through them when they answer (its "remote" backend), so an
evaluation needs no tokenizer files beside the server; the ids are the ones the completions endpoints use.
"""
from __future__ import annotations

from fastapi import Request
from pydantic import BaseModel, Field, StrictBool, StrictInt, model_validator

from toolkit.serve.api_error import ApiError
from toolkit.serve.messages import Message


# vLLM's /tokenize fields this server does not apply, with the value that leaves them alone: refused when set (the
# ids would silently differ from what the caller asked for)
UNSERVED = {"chat_template": None, "mm_processor_kwargs": None}


class TokenizeRequest(BaseModel):
    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = Field(default=None, min_length=1)
    add_special_tokens: StrictBool | None = None  # None: true for a prompt, false for messages (vLLM's defaults)
    add_generation_prompt: StrictBool = True      # messages: end with the assistant's turn opening, as chat does
    continue_final_message: StrictBool = False    # messages: leave the last (assistant) message open
    chat_template_kwargs: dict | None = None
    tools: list | None = None                     # messages: function tools the template shows, as chat does
    return_token_strs: StrictBool = False         # each id's text too

    @model_validator(mode="before")
    @classmethod
    def no_unserved(cls, data):
        for name, default in (UNSERVED.items() if isinstance(data, dict) else ()):
            if data.get(name, default) not in (default, None):
                raise ApiError(400, f"{name} is not supported by this server's /tokenize; leave it out", name)
        return data

    @model_validator(mode="after")
    def one_input(self):
        if (self.prompt is None) == (self.messages is None):
            raise ApiError(400, "give either prompt (a text) or messages (a chat), not both or neither", "prompt")
        if self.tools:
            from toolkit.serve.tools import check_tools

            if self.messages is None:
                raise ApiError(400, "tools go with messages (the chat template shows them), not a prompt", "tools")
            check_tools(self.tools)
        from toolkit.data.tokenizer import template_kwargs

        try:
            self.chat_template_kwargs = template_kwargs(self.chat_template_kwargs, "chat_template_kwargs")
        except ValueError as e:
            raise ApiError(400, str(e), "chat_template_kwargs") from None
        return self


class DetokenizeRequest(BaseModel):
    model: str | None = None
    tokens: list[StrictInt]


def add_tokenizer_routes(app, parse, tok, chat_text, vocab: int, max_len: int) -> None:
    """`parse(request, Model)`: the app's body parser (JSON, validation, model name); `chat_text(messages,
    template_kwargs, add_generation_prompt, continue_final_message, tools)`: the served chat template applied as the
    chat endpoint applies it."""

    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = await parse(request, TokenizeRequest)
        if body.prompt is not None:
            ids = tok(body.prompt, add_special_tokens=body.add_special_tokens is not False).input_ids
        else:
            text = chat_text(body.messages, body.chat_template_kwargs, body.add_generation_prompt,
                             body.continue_final_message, body.tools)
            ids = tok(text, add_special_tokens=bool(body.add_special_tokens)).input_ids
        strs = tok.convert_ids_to_tokens(ids) if body.return_token_strs else None
        return {"count": len(ids), "max_model_len": max_len, "tokens": ids, "token_strs": strs}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        body = await parse(request, DetokenizeRequest)
        if any(not 0 <= t < vocab for t in body.tokens):
            raise ApiError(400, f"tokens must be ids in 0..{vocab - 1}", "tokens")
        return {"prompt": tok.decode(body.tokens)}

    @app.get("/tokenizer_info")
    async def tokenizer_info():
        special = {name: getattr(tok, name, None) for name in ("bos_token", "eos_token", "pad_token", "unk_token")}
        return {"tokenizer_class": type(tok).__name__, **{k: v if isinstance(v, str) else None
                                                          for k, v in special.items()},
                "chat_template": tok.chat_template if isinstance(tok.chat_template, str) else None,
                "model_max_length": max_len, "vocab_size": vocab}
