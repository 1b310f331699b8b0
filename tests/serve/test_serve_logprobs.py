"""`logprobs` served as OpenAI's API gives them: chat's `logprobs` / `top_logprobs` and completions' `logprobs: k`,
whole or streamed, one entry per completion token (through the token that completed a stop string), the figures
those of the engine's own run, and the shapes the openai client parses."""
import json

import pytest
from fastapi.testclient import TestClient

from toolkit.data.tokenizer import load_tokenizer
from toolkit.infer.engine import Engine
from toolkit.infer.loading import load_target
from toolkit.infer.sampling import SamplingParams
from toolkit.serve.logprobs import LogprobWriter

MESSAGES = [{"role": "user", "content": "Name three colors."}]


@pytest.fixture(scope="module")
def client(tiny_target, in_process_app):
    with in_process_app(tiny_target, stops=()) as (asgi, _), TestClient(asgi) as c:
        yield c


@pytest.fixture(scope="module")
def tok(tiny_target):
    return load_tokenizer(model=str(tiny_target))


@pytest.fixture(scope="module")
def alone(tiny_target):
    """The engine's own greedy run of a prompt (ids), with log-probs: what the server must report."""
    engine = Engine(load_target(tiny_target), max_len=128)
    return lambda ids, n, top: engine.generate(ids, SamplingParams(max_new_tokens=n, logprobs=top))


def chat_ids(tok) -> list[int]:
    return tok(tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True),
               add_special_tokens=False).input_ids


def stream(client, path: str, body: dict) -> list[dict]:
    with client.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def close(a, b) -> bool:  # figures through JSON and one engine run against another: equal to float rounding
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b))
    return a == pytest.approx(b, abs=1e-5) if isinstance(a, float) else a == b


def test_chat_logprobs_whole_and_streamed_are_the_engines(client, alone, tok):
    from openai.types.chat import ChatCompletion

    body = {"messages": MESSAGES, "max_tokens": 12, "temperature": 0, "logprobs": True, "top_logprobs": 3}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    result = alone(chat_ids(tok), 12, 3)
    lp = out["choices"][0]["logprobs"]
    assert close(lp, LogprobWriter(tok, chat=True)(result.logprobs))
    assert len(lp["content"]) == out["usage"]["completion_tokens"] == 12
    first = lp["content"][0]
    assert len(first["top_logprobs"]) == 3 and first["bytes"] == list(first["token"].encode("utf-8"))
    assert "".join(e["token"] for e in lp["content"]) == out["choices"][0]["message"]["content"]
    assert ChatCompletion.model_validate(out).choices[0].logprobs.content[0].top_logprobs[0].logprob <= 0

    chunks = stream(client, "/v1/chat/completions", body)
    joined = [e for c in chunks for ch in c["choices"] if ch["logprobs"] for e in ch["logprobs"]["content"]]
    assert close(joined, lp["content"])  # every entry once, in order
    assert "".join(ch["delta"].get("content") or "" for c in chunks for ch in c["choices"]) == \
        out["choices"][0]["message"]["content"]


def test_completions_logprobs_list_the_chosen_and_the_k_likeliest(client, alone, tok):
    from openai.types import Completion

    body = {"prompt": "The colors of the sky are", "max_tokens": 10, "temperature": 0, "logprobs": 2}
    out = client.post("/v1/completions", json=body).json()
    lp = out["choices"][0]["logprobs"]
    result = alone(tok("The colors of the sky are").input_ids, 10, 2)
    assert close(lp, LogprobWriter(tok, chat=False)(result.logprobs))
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["text_offset"]) == 10
    assert all(t in top and 2 <= len(top) <= 3 for t, top in zip(lp["tokens"], lp["top_logprobs"]))
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(10)]
    Completion.model_validate(out)

    chunks = stream(client, "/v1/completions", body)
    parts = [c["choices"][0]["logprobs"] for c in chunks if c["choices"] and c["choices"][0]["logprobs"]]
    assert sum((p["tokens"] for p in parts), []) == lp["tokens"]
    assert sum((p["text_offset"] for p in parts), []) == lp["text_offset"]  # offsets run on across chunks

    zero = client.post("/v1/completions", json={**body, "logprobs": 0}).json()["choices"][0]["logprobs"]
    assert [list(d) for d in zero["top_logprobs"]] == [[t] for t in zero["tokens"]]  # the chosen one alone
    plain = client.post("/v1/completions", json={k: v for k, v in body.items() if k != "logprobs"}).json()
    assert plain["choices"][0]["logprobs"] is None


def test_a_stop_string_cuts_the_entries_where_usage_counts(client):
    body = {"messages": MESSAGES, "max_tokens": 24, "temperature": 0, "logprobs": True}
    full = client.post("/v1/chat/completions", json=body).json()
    text = full["choices"][0]["message"]["content"]
    stop = text[len(text) // 2:len(text) // 2 + 3]
    assert stop.strip() and stop in text
    for chunks in (None, stream(client, "/v1/chat/completions", {**body, "stop": [stop]})):
        if chunks is None:
            cut = client.post("/v1/chat/completions", json={**body, "stop": [stop]}).json()
            entries, n = cut["choices"][0]["logprobs"]["content"], cut["usage"]["completion_tokens"]
        else:
            entries = [e for c in chunks for ch in c["choices"] if ch["logprobs"] for e in ch["logprobs"]["content"]]
            n = None
        assert entries == full["choices"][0]["logprobs"]["content"][:len(entries)] and len(entries) < 24
        assert stop in "".join(e["token"] for e in entries)  # through the token that completed it, no further
        assert stop not in "".join(e["token"] for e in entries[:-1])
        assert n is None or n == len(entries)


@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", {"messages": MESSAGES, "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": MESSAGES, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": MESSAGES, "logprobs": 3}, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 21}, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "logprobs": True}, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "logprobs": -1}, "logprobs")])
def test_bad_logprobs_are_refused_naming_the_field(client, path, body, param):
    r = client.post(path, json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
