"""OpenAI request bodies as validated pydantic models; what they refuse is an `ApiError` (api_error.py)."""
from __future__ import annotations

import json
from typing import ClassVar

from pydantic import BaseModel, Field, PrivateAttr, StrictBool, StrictInt, field_validator, model_validator

from toolkit.serve.api_error import ApiError
from toolkit.serve.logprobs import MAX_LOGPROBS
from toolkit.serve.messages import Message

MAX_STOP_CHARS = 1024  # per stop string
REASONING_EFFORTS = ("low", "medium", "high")  # vLLM's; gpt-oss's template writes it into its system message
# vLLM's / SGLang's extra fields that change the output (constrained decoding, stop text kept, special tokens shown,
# beam search, token filters), with the value that leaves it alone: refused when set, not silently ignored as
# unknown fields are; a reply that ignored its constraint looks like an answer and is not the one asked for
UNSERVED_EXTRAS = {"structural_tag": None, "guided_decoding_backend": None, "guided_whitespace_pattern": None,
                   "include_stop_str_in_output": False, "no_stop_trim": False,
                   "skip_special_tokens": True, "use_beam_search": False,
                   "logits_processors": None,
                   "truncate_prompt_tokens": None, "custom_logit_processor": None}
CHAT_UNSERVED_EXTRAS = {"chat_template": None,
                        "echo": False, "functions": None}  # functions: OpenAI's older tools


class StreamOptions(BaseModel):
    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False  # vLLM's: with include_usage, every chunk its choice's counts so far


class Sampling(BaseModel):
    """Fields both endpoints share."""
    unserved: ClassVar[dict] = UNSERVED_EXTRAS
    model: str | None = None
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    # None: not sent, the served target's recommended value applies (toolkit/serve/defaults.py)
    temperature: float | None = Field(default=None, ge=0.0, allow_inf_nan=False)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: StrictInt | None = Field(default=None, ge=-1)  # 0 or -1 = off (vLLM's -1 accepted)
    stop: str | list[str] | None = None
    seed: StrictInt | None = Field(default=None, ge=-2 ** 63, le=2 ** 64 - 1)  # what torch.Generator takes
    n: StrictInt = Field(default=1, ge=1)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0, allow_inf_nan=False)  # OpenAI's range
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0, allow_inf_nan=False)
    logit_bias: dict | tuple | None = ()  # read as ((token id, bias), ...)
    response_format: dict | None = None
    # structured output (toolkit/infer/grammar.py), as vLLM's guided_* / structured_outputs and SGLang's names
    guided_json: dict | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structured_outputs: dict | None = None  # vLLM's newer {"json" | "regex" | "choice" | "grammar" | "json_object"}
    json_schema: dict | str | None = None   # SGLang's
    regex: str | None = None                # SGLang's
    ebnf: str | None = None                 # SGLang's
    user: str | None = None
    # vLLM's sampling extras that benchmark clients send, served
    ignore_eos: StrictBool = False
    stop_token_ids: list[StrictInt] | None = None
    min_tokens: StrictInt = Field(default=0, ge=0)  # stop ids masked, stop strings unchecked until this many
    min_p: float | None = Field(default=None, ge=0.0, le=1.0, allow_inf_nan=False)  # None: the served default
    repetition_penalty: float | None = Field(default=None, gt=0.0, allow_inf_nan=False)
    prompt_logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_LOGPROBS)  # each prompt token's (vLLM's)
    allowed_token_ids: list[StrictInt] | None = None  # vLLM's: only these may be generated
    bad_words: list[str] | None = None                # vLLM's: words the reply never writes
    return_token_ids: StrictBool | None = None  # vLLM's: prompt_token_ids and each choice's token_ids beside the text
    return_tokens_as_token_ids: StrictBool | None = None  # vLLM's: logprobs name tokens "token_id:{id}"

    @model_validator(mode="before")
    @classmethod
    def no_unserved_extras(cls, data):
        for name, default in (cls.unserved.items() if isinstance(data, dict) else ()):
            value = data.get(name)
            if value is not None and value != default and value not in ([], {}, ""):
                what = f"{name} is" if default is None else f"{name} other than {json.dumps(default)} is"
                raise ApiError(400, f"{what} not supported by this server; leave it out", name)
        return data

    @field_validator("max_tokens", "temperature", "top_p", "top_k", "n", "stream", "presence_penalty",
                     "frequency_penalty", "ignore_eos", "min_tokens", "min_p", "repetition_penalty", mode="before")
    @classmethod
    def null_is_default(cls, value, info):
        """OpenAI lets these be null (clients send null for unset fields): null means the default."""
        return cls.model_fields[info.field_name].default if value is None else value

    @field_validator("seed")
    @classmethod
    def minus_one_is_no_seed(cls, seed):
        return None if seed == -1 else seed  # as vLLM reads it: -1 is a random seed, not the fixed seed -1

    @field_validator("temperature", "top_p", "presence_penalty", "frequency_penalty", "min_p",
                     "repetition_penalty", mode="before")
    @classmethod
    def number_not_bool(cls, value):
        if isinstance(value, bool):  # JSON true is no number (pydantic would read it as 1.0)
            raise ValueError("expected a number, got a boolean")
        return value

    @field_validator("logit_bias")
    @classmethod
    def bias_pairs(cls, bias):
        """OpenAI's {"token id": bias in [-100, 100]} -> ((id, bias), ...), ids in order."""
        pairs = []
        for key, value in (bias or {}).items():
            try:
                token = int(key)
            except (TypeError, ValueError):
                raise ValueError(f"keys are token ids, got {key!r}") from None
            if token < 0 or isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
                raise ValueError(f"maps token ids >= 0 to biases in [-100, 100], got {key!r}: {value!r}")
            pairs.append((token, float(value)))
        return tuple(sorted(pairs))

    @field_validator("stop")
    @classmethod
    def stop_strings(cls, stop):
        stops = [stop] if isinstance(stop, str) else (stop or [])
        # the stream holds back any tail that could still become a stop string, a check whose cost grows with the
        # square of the string's length at every update: a 4 MB body must not buy a stop string that stalls it
        if len(stops) > 16 or any(not s or len(s) > MAX_STOP_CHARS for s in stops):
            raise ValueError(f"give at most 16 non-empty stop strings of at most {MAX_STOP_CHARS} characters")
        return stops

    @model_validator(mode="after")
    def supported(self):
        if self.prompt_logprobs is not None and self.stream:  # as vLLM refuses it
            raise ApiError(400, "prompt_logprobs is not available with stream: true", "prompt_logprobs")
        if self.stream_options is not None and not self.stream:
            raise ApiError(400, "stream_options is only allowed with stream: true", "stream_options")
        from toolkit.serve.structured import constraint

        constraint(self)  # at most one, of a known form
        return self


class ChatRequest(Sampling):
    unserved: ClassVar[dict] = {**UNSERVED_EXTRAS, **CHAT_UNSERVED_EXTRAS}
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)
    tools: list | None = None              # function tools (toolkit/serve/tools.py)
    tool_choice: str | dict | None = None  # none, auto, required, or a named function; absent: auto with tools
    parallel_tool_calls: StrictBool | None = None  # false: one call at most
    chat_template_kwargs: dict | None = None  # vLLM's / SGLang's extra template variables (Qwen3: enable_thinking)
    reasoning_effort: str | None = None     # OpenAI's: the template's reasoning_effort (gpt-oss's system message)
    add_special_tokens: StrictBool = False  # vLLM's: a BOS on top of the template's own (the template has one)
    # vLLM's: end on the assistant turn's opening (default), or continue the last (assistant) message as written
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    logprobs: StrictBool | None = None
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    _tools = PrivateAttr(default=None)  # the tool choice read (tools.ToolChoice)

    @property
    def tool(self):
        return self._tools

    def logprob_count(self) -> int | None:
        """None: no log-probs asked; k: each token's and its k likeliest alternatives (serve/logprobs.py)."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def prompt_logprob_count(self) -> int | None:
        return self.prompt_logprobs

    @model_validator(mode="after")
    def chat_supported(self):
        from toolkit.data.tokenizer import template_kwargs

        try:
            self.chat_template_kwargs = template_kwargs(self.chat_template_kwargs, "chat_template_kwargs")
        except ValueError as e:
            raise ApiError(400, str(e), "chat_template_kwargs") from None
        if self.reasoning_effort is not None:  # as vLLM and SGLang pass it; a chat_template_kwargs value wins
            if self.reasoning_effort not in REASONING_EFFORTS:
                raise ApiError(400, f"reasoning_effort {self.reasoning_effort!r}: give one of "
                                    f"{', '.join(REASONING_EFFORTS)}", "reasoning_effort")
            self.chat_template_kwargs.setdefault("reasoning_effort", self.reasoning_effort)
        if self.top_logprobs and not self.logprobs:  # as OpenAI and vLLM refuse it
            raise ApiError(400, "top_logprobs needs logprobs: true", "top_logprobs")
        from toolkit.serve.tools import check_tools, read_choice

        self._tools = read_choice(check_tools(self.tools or []), self.tool_choice, self.parallel_tool_calls)
        if self.max_completion_tokens is not None:  # OpenAI's newer name wins over max_tokens
            self.max_tokens = self.max_completion_tokens
        if self.continue_final_message:
            if self.add_generation_prompt:  # as vLLM refuses it
                raise ApiError(400, "continue_final_message needs add_generation_prompt: false (one continues the "
                                    "last message, the other opens a new turn)", "continue_final_message")
            if self.messages[-1].role != "assistant":
                raise ApiError(400, "messages: continue_final_message continues an assistant message, so the last "
                                    "one must be the assistant's", "messages")
        elif self.messages[-1].role == "assistant":
            raise ApiError(400, "messages: the last one must not be the assistant's (nothing to answer; to continue "
                                "it, send continue_final_message: true with add_generation_prompt: false)", "messages")
        return self


class CompletionRequest(Sampling):
    max_tokens: StrictInt | None = Field(default=16, ge=0)  # the legacy endpoint's default (OpenAI, vLLM); 0: echo
    prompt: str | list[str] | list[StrictInt] | list[list[StrictInt]]  # one prompt or a batch of them
    echo: StrictBool = False  # the prompt before the completion, in the text and in logprobs
    suffix: str | None = None
    add_special_tokens: StrictBool = True  # vLLM's: the tokenizer's BOS before the prompt text
    best_of: int | None = None
    logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_LOGPROBS)  # 0: the chosen tokens' own alone

    @field_validator("echo", mode="before")
    @classmethod
    def null_echo_is_false(cls, value):
        """OpenAI lets echo be null (as vLLM reads it): null is the default, no echo."""
        return False if value is None else value

    def logprob_count(self) -> int | None:
        return self.logprobs

    def prompts(self) -> list[str | list[int]]:
        """The batch: each a text or token ids (one prompt alone is a batch of one)."""
        if isinstance(self.prompt, str) or (self.prompt and isinstance(self.prompt[0], int)):
            return [self.prompt]
        return list(self.prompt)

    def prompt_logprob_count(self) -> int | None:
        """How many likeliest tokens the engine lists beside each prompt token: vLLM's prompt_logprobs, or echo's
        logprobs (the prompt's entries come first), whichever asks more; None: neither asks."""
        asks = [k for k in (self.prompt_logprobs, self.logprobs if self.echo else None) if k is not None]
        return max(asks) if asks else None

    @model_validator(mode="after")
    def completion_supported(self):
        if not self.prompt or any(not p for p in self.prompts()):
            raise ApiError(400, "prompt is empty (or one of the batch is)", "prompt")
        if self.max_tokens == 0 and not self.echo:
            raise ApiError(400, "max_tokens 0 needs echo: true (the prompt scored, nothing generated); otherwise "
                                "give at least 1", "max_tokens")
        for name, bad in (("suffix", self.suffix), ("best_of", (self.best_of or 1) > 1)):
            if bad:
                raise ApiError(400, f"{name} is not supported", name)
        return self
