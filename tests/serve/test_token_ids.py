"""vLLM's return_token_ids (prompt_token_ids and each choice's token_ids, whole and streamed) and
return_tokens_as_token_ids (log-prob tokens named "token_id:{id}"), on chat and completions."""
from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

MESSAGES = [{"role": "user", "content": "Tell me a story"}]


@pytest.fixture(scope="module")
def client(tiny_target, in_process_app):
    with in_process_app(tiny_target, max_len=256) as (app, engine), TestClient(app) as http:
        yield http


def stream(http, path: str, body: dict) -> list[dict]:
    with http.stream("POST", path, json={**body, "stream": True}) as r:
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]


def test_chat_token_ids_whole_and_streamed(client):
    body = {"messages": MESSAGES, "max_tokens": 10, "temperature": 0, "return_token_ids": True}
    r = client.post("/v1/chat/completions", json=body).json()
    prompt = client.post("/tokenize", json={"messages": MESSAGES}).json()["tokens"]
    assert r["prompt_token_ids"] == prompt and len(r["choices"][0]["token_ids"]) == r["usage"]["completion_tokens"]
    detok = client.post("/detokenize", json={"tokens": r["choices"][0]["token_ids"]}).json()["prompt"]
    assert detok == r["choices"][0]["message"]["content"]
    chunks = stream(client, "/v1/chat/completions", body)
    assert chunks[0]["prompt_token_ids"] == prompt and all("prompt_token_ids" not in c for c in chunks[1:])
    assert sum((c["choices"][0].get("token_ids", []) for c in chunks if c["choices"]), []) == \
        r["choices"][0]["token_ids"]
    plain = client.post("/v1/chat/completions", json={**body, "return_token_ids": False}).json()
    assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]


def test_completion_token_ids_stop_at_the_stop_string_and_batches(client):
    base = client.post("/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 12,
                                                "temperature": 0}).json()["choices"][0]["text"]
    stop = base.split()[2]
    r = client.post("/v1/completions", json={"prompt": ["Once upon a time", "The sky"], "max_tokens": 12,
                                             "temperature": 0, "stop": [stop], "return_token_ids": True}).json()
    first, second = r["choices"]
    assert first["finish_reason"] == "stop" and stop not in first["text"]
    assert first["token_ids"] and client.post("/detokenize", json={"tokens": first["token_ids"]}).json()[
        "prompt"].startswith(first["text"])  # through the token that completed the stop string
    ids = client.post("/tokenize", json={"prompt": "The sky"}).json()["tokens"]
    assert second["prompt_token_ids"] == ids
    assert len(first["token_ids"]) + len(second["token_ids"]) == r["usage"]["completion_tokens"]
    chunks = stream(client, "/v1/completions", {"prompt": "The sky", "max_tokens": 6, "temperature": 0,
                                                "return_token_ids": True})
    assert chunks[0]["choices"][0]["prompt_token_ids"] == ids
    assert all("prompt_token_ids" not in c["choices"][0] for c in chunks[1:] if c["choices"])
    assert len(sum((c["choices"][0]["token_ids"] for c in chunks if c["choices"]), [])) == 6


def test_logprob_tokens_as_token_ids(client):
    r = client.post("/v1/completions", json={"prompt": "The sky", "max_tokens": 4, "temperature": 0, "logprobs": 1,
                                             "return_tokens_as_token_ids": True, "return_token_ids": True}).json()
    c = r["choices"][0]
    assert c["logprobs"]["tokens"] == [f"token_id:{t}" for t in c["token_ids"]]
    assert all(k.startswith("token_id:") for top in c["logprobs"]["top_logprobs"] for k in top)
    chat = client.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 3, "temperature": 0,
                                                     "logprobs": True, "top_logprobs": 2,
                                                     "return_tokens_as_token_ids": True}).json()
    entry = chat["choices"][0]["logprobs"]["content"][0]
    assert entry["token"].startswith("token_id:") and entry["bytes"] == list(entry["token"].encode())


def test_streamed_token_ids_held_back_by_a_tool_parser_go_with_the_next_chunk(tools_target, in_process_app):
    """A chunk whose text the tool parser holds back (a call not closed yet) is not sent: its token ids go with
    the next one, so the streamed ids join to the whole reply's."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    call = '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    body = {"messages": MESSAGES, "max_tokens": 60, "temperature": 0, "return_token_ids": True, "tools": tools,
            "guided_regex": "Sure\\.\n" + call.replace("{", "\\{").replace("}", "\\}")}  # a call the parser reads
    with in_process_app(tools_target, max_len=256, tool_parser="hermes") as (app, _), TestClient(app) as http:
        whole = http.post("/v1/chat/completions", json=body).json()["choices"][0]
        sent = [c["choices"][0] for c in stream(http, "/v1/chat/completions", body) if c["choices"]]
        assert whole["message"]["tool_calls"] and whole["finish_reason"] == "tool_calls"
        assert sum((c.get("token_ids", []) for c in sent), []) == whole["token_ids"]
        [at] = [i for i, c in enumerate(sent) if c["delta"].get("tool_calls")]  # sent once the call closed
        through = sum((c.get("token_ids", []) for c in sent[:at + 1]), [])  # the ids sent by then hold all of it
        assert http.post("/detokenize", json={"tokens": through}).json()["prompt"].endswith(call)
