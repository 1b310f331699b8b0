"""`n` > 1: a request's choices are sequences of their own (choice i samples with seed + i, so each is the
reply one request with that seed gets), whole or streamed (chunks of the choices interleave; each choice gets
its role chunk and its finish chunk), usage counts the prompt once and the choices' tokens summed, log-probs
come per choice."""
import json

import pytest
from fastapi.testclient import TestClient

MESSAGES = [{"role": "user", "content": "Name three colors."}]


@pytest.fixture(scope="module")
def client(tiny_target, in_process_app):
    with in_process_app(tiny_target, stops=()) as (asgi, engine), TestClient(asgi) as c:
        yield c


def ask(client, path="/v1/chat/completions", **body) -> dict:
    r = client.post(path, json={"messages": MESSAGES, **body} if "chat" in path else body)
    assert r.status_code == 200, r.text
    return r.json()


def texts(out: dict) -> list[str]:
    return [c["message"]["content"] if "message" in c else c["text"] for c in out["choices"]]


def test_each_choice_is_the_reply_its_seed_gives(client):
    body = {"max_tokens": 10, "temperature": 1.0, "top_k": 0, "seed": 11}
    out = ask(client, n=3, **body)
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    alone = [ask(client, **{**body, "seed": 11 + i}) for i in range(3)]
    assert texts(out) == [texts(a)[0] for a in alone]
    assert len(set(texts(out))) > 1  # three samples, not one three times
    assert out["usage"]["prompt_tokens"] == alone[0]["usage"]["prompt_tokens"]
    assert out["usage"]["completion_tokens"] == sum(a["usage"]["completion_tokens"] for a in alone) == 30
    assert out["usage"]["total_tokens"] == out["usage"]["prompt_tokens"] + 30
    assert all(c["finish_reason"] == "length" for c in out["choices"])
    greedy = ask(client, n=2, max_tokens=8, temperature=0)
    assert texts(greedy) == texts(ask(client, max_tokens=8, temperature=0)) * 2


def test_streamed_choices_interleave_and_each_ends_once(client):
    body = {"messages": MESSAGES, "max_tokens": 12, "temperature": 1.0, "seed": 3, "n": 3,
            "stream_options": {"include_usage": True}}
    whole = ask(client, **{k: v for k, v in body.items() if k not in ("messages", "stream_options")})
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    per = {i: [ch for c in chunks for ch in c["choices"] if ch["index"] == i] for i in range(3)}
    for i, parts in per.items():
        assert parts[0]["delta"] == {"role": "assistant", "content": ""}
        assert [p["finish_reason"] for p in parts if p["finish_reason"]] == ["length"]
        assert parts[-1]["finish_reason"] == "length"  # nothing of this choice after its end
        assert "".join(p["delta"].get("content") or "" for p in parts) == texts(whole)[i]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 36
    assert all(len(c["choices"]) == 1 for c in chunks[:-1])  # one choice per chunk, as OpenAI sends them


def test_completions_choices_carry_their_own_logprobs(client):
    out = ask(client, "/v1/completions", prompt="The sky is", max_tokens=6, temperature=1.0, seed=4, n=2,
              logprobs=1)
    for c in out["choices"]:
        assert len(c["logprobs"]["tokens"]) == 6 and "".join(c["logprobs"]["tokens"]) == c["text"]
    assert out["usage"]["completion_tokens"] == 12


@pytest.mark.parametrize("n", [0, 5])  # the in-process server queues 4
def test_n_out_of_range_is_refused(client, n):
    r = client.post("/v1/chat/completions", json={"messages": MESSAGES, "n": n})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text


def test_continuous_usage_stats_count_each_choice_so_far(client):
    """vLLM's continuous_usage_stats: every chunk carries its choice's counts so far, rising to what the choice
    ends with (12 tokens, or those through a stop string); the last chunk the whole request's."""
    body = {"messages": MESSAGES, "max_tokens": 12, "temperature": 1.0, "seed": 3, "n": 2, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    prompt = chunks[-1]["usage"]["prompt_tokens"]
    for i in range(2):
        seen = [c["usage"] for c in chunks[:-1] if c["choices"][0]["index"] == i]
        assert seen[0]["completion_tokens"] == 0 and seen[-1]["completion_tokens"] == 12  # role chunk .. finish
        assert all(u["prompt_tokens"] == prompt and u["total_tokens"] == prompt + u["completion_tokens"] for u in seen)
        assert [u["completion_tokens"] for u in seen] == sorted(u["completion_tokens"] for u in seen)
    assert chunks[-1]["usage"]["completion_tokens"] == 24
    plain = {**body, "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/chat/completions", json=plain) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert all(c["usage"] is None for c in chunks[:-1])
