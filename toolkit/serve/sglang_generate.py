"""SGLang's native `POST /generate`, as its clients and benchmark scripts (SpecForge's and SGLang's own acceptance
tests read `meta_info.spec_verify_ct`) send it: `text` or `input_ids` (one prompt or a batch), `sampling_params`
in SGLang's names, `stream` (each event the output so far, cumulative, as SGLang streams by default, then
`data: [DONE]`), `return_logprob` with `top_logprobs_num` (and the prompt's from `logprob_start_len`). Served as the completions request it amounts to
(app.py's steps), so the same checks and engine sequences apply.

An output: {"text", "output_ids", "meta_info": {"id", "finish_reason": {"type": "stop", "matched": token id or
string} | {"type": "length", "length": N}, "prompt_tokens", "completion_tokens", "cached_tokens", "e2e_latency",
and with a draft SGLang's speculation keys: "spec_verify_ct", "spec_accept_length" (completion_tokens /
spec_verify_ct, SGLang's formula), "spec_accept_rate" (accepted / drafted), "spec_accept_token_num",
"spec_draft_token_num" (and the newer names spec_accepted_drafts / spec_proposed_drafts / spec_num_correct_drafts /
spec_num_proposed_drafts), "spec_accept_histogram"}}: one object for one prompt with n 1, else a list, prompt-major.
"""
from __future__ import annotations

import json
import time
import uuid

from fastapi import Request
from pydantic import BaseModel, ConfigDict

from toolkit.infer.metrics import summarize
from toolkit.serve.api_error import ApiError
from toolkit.serve.json_body import read_object, validated
from toolkit.serve.protocol import CompletionRequest
from toolkit.serve.reply import event_stream

# SGLang sampling_params -> completions fields (None: the same name; the completions request checks each value)
RENAMED = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens", "sampling_seed": "seed",
           "temperature": None, "top_p": None, "top_k": None, "min_p": None, "stop": None, "stop_token_ids": None,
           "ignore_eos": None, "n": None, "frequency_penalty": None, "presence_penalty": None,
           "repetition_penalty": None, "json_schema": None, "regex": None, "ebnf": None, "logit_bias": None,
           "skip_special_tokens": None, "no_stop_trim": None}
IGNORED = {"spaces_between_special_tokens", "custom_params", "stream_interval"}  # taken, changing nothing here


class GenerateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict | None = None
    stream: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = 0
    logprob_start_len: int = -1
    return_text_in_logprobs: bool = False
    rid: str | None = None
    model: str | None = None  # not SGLang's (it serves one model); a router may add it: not checked

    def completion(self) -> tuple[CompletionRequest, bool]:
        """The completions request this amounts to, and whether one object answers (one prompt, n 1)."""
        if (self.text is None) == (self.input_ids is None):
            raise ApiError(400, "give exactly one of text and input_ids", "text")
        if self.logprob_start_len < -1:
            raise ApiError(400, f"logprob_start_len: give -1 (the output's log-probs alone) or the prompt position "
                                f"to list the prompt's from, got {self.logprob_start_len}", "logprob_start_len")
        params = dict(self.sampling_params or {})
        unknown = sorted(set(params) - set(RENAMED) - set(IGNORED))
        if unknown:
            raise ApiError(400, f"sampling_params: {', '.join(unknown)} not served; accepted: "
                                f"{', '.join(sorted({*RENAMED, *IGNORED}))}", "sampling_params")
        body = {RENAMED[k] or k: v for k, v in params.items() if k in RENAMED}
        body.setdefault("max_tokens", 128)  # SGLang's default max_new_tokens
        if body.get("top_k") == -1:  # SGLang's "no top-k"
            body.pop("top_k")
        if self.return_logprob:
            body["logprobs"] = self.top_logprobs_num
            if self.logprob_start_len >= 0:  # the prompt's too, from that position (read from the prefill)
                body["prompt_logprobs"] = self.top_logprobs_num
        prompt = self.text if self.text is not None else self.input_ids
        body.update(prompt=prompt, add_special_tokens=self.text is not None)
        request = validated(CompletionRequest, body)
        single = (isinstance(prompt, str) or (prompt and isinstance(prompt[0], int))) and request.n == 1
        return request, single


def add_generate_route(app, completion_sequences, queued, engine) -> None:
    """`completion_sequences(body)` a completions request's engine sequences and prompt texts, `queued` them queued
    with their Reply (app.py)."""
    speculates = engine.head is not None or engine.lookup is not None

    def meta(c, done: bool, rid: str, start: float, logprobs: bool, with_text: bool, start_len: int) -> dict:
        n = c.sent_tokens()
        out = {"id": f"{rid}-{c.index}", "finish_reason": None, "prompt_tokens": len(c.req.seq.prompt),
               "completion_tokens": n, "cached_tokens": 0, "e2e_latency": round(time.perf_counter() - start, 4)}
        if done:  # the engine is through: the final counts
            result = c.result()
            reason = c.finish_reason()
            matched = c.stop_reason()
            out["finish_reason"] = ({"type": "length", "length": n} if reason == "length" else
                                    {"type": "stop", "matched": matched if matched is not None else
                                     (result.tokens[-1] if result.tokens else None)})
            out["cached_tokens"] = result.cached_tokens
            if speculates:
                s = summarize([result])
                steps, accepted = s["verify_steps"], sum(result.accepted)
                drafted = sum(result.checked)  # the draft tokens its verify steps checked
                out |= {"spec_verify_ct": steps, "spec_accept_length": n / steps if steps else 0.0,
                        "spec_accept_rate": accepted / drafted if drafted else 0.0,
                        "spec_accept_token_num": accepted, "spec_draft_token_num": drafted,
                        "spec_accepted_drafts": accepted, "spec_proposed_drafts": drafted,
                        "spec_num_correct_drafts": accepted, "spec_num_proposed_drafts": drafted,
                        "spec_accept_histogram": s["accepted_length_histogram"]}
        if logprobs:
            entries = c.logprobs[:n]
            text = c.write.text if with_text else (lambda t: None)  # noqa: E731
            out["output_token_logprobs"] = [[e.logprob, e.token, text(e.token)] for e in entries]
            out["output_top_logprobs"] = [[[lp, t, text(t)] for t, lp in e.top] for e in entries]
            if done and start_len >= 0:  # the first prompt token has no figure (nothing precedes it)
                prompt, scored = c.req.seq.prompt, c.req.seq.result.prompt_logprobs
                out["input_token_logprobs"] = ([[None, prompt[0], text(prompt[0])]] + [
                    [e.logprob, e.token, text(e.token)] for e in scored])[start_len:]
                out["input_top_logprobs"] = ([None] + [[[lp, t, text(t)] for t, lp in e.top]
                                                       for e in scored])[start_len:]
        return out

    @app.post("/generate")
    async def generate(request: Request):
        req = validated(GenerateRequest, await read_object(request))
        body, single = req.completion()
        seqs, texts = await completion_sequences(body)
        reply = queued(body, seqs, texts, chat=False)
        rid, start = req.rid or uuid.uuid4().hex, time.perf_counter()
        wants_text = req.return_text_in_logprobs

        def output(c, text: str, done: bool) -> dict:
            return {"text": text, "output_ids": c.generated[:c.sent_tokens()],
                    "meta_info": meta(c, done, rid, start, req.return_logprob, wants_text, req.logprob_start_len)}

        if not req.stream:
            whole = await reply.whole(request)
            outs = [output(c, ch["text"], True) for c, ch in zip(reply.choices, whole["choices"])]
            return outs[0] if single else outs

        async def events():
            texts = {c.index: "" for c in reply.choices}
            async for chunk in reply.chunks():
                if "error" in chunk:
                    yield f"data: {json.dumps(chunk)}\n\n"
                    continue
                for part in chunk["choices"]:
                    c = reply.choices[part["index"]]
                    texts[c.index] += part["text"]
                    event = output(c, texts[c.index], part["finish_reason"] is not None)
                    yield f"data: {json.dumps(event if single else {**event, 'index': c.index})}\n\n"
            yield "data: [DONE]\n\n"

        return event_stream(events())
