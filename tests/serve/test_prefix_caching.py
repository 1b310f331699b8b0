"""The prefix cache as clients see it (`toolkit serve --prefix-cache-rows N`, default 4): a later chat turn reports
the prompt tokens it did not prefill as OpenAI does (usage.prompt_tokens_details.cached_tokens), the Responses API
as input_tokens_details.cached_tokens, Anthropic's as cache_read_input_tokens (input_tokens then counts the rest),
/metrics as toolkit_cached_prompt_tokens_total; the replies are those of a server without the cache."""
import pytest
from fastapi.testclient import TestClient

from toolkit.cli import main

Q1, Q2 = "What is the capital of France?", "And of Italy?"


@pytest.fixture(scope="module")
def clients(tiny_target, in_process_app):
    with in_process_app(tiny_target, max_len=256, prefix_cache_rows=2) as (cached, _), \
            in_process_app(tiny_target, max_len=256) as (plain, _), TestClient(cached) as c, TestClient(plain) as p:
        yield c, p


def chat(client, messages) -> dict:
    r = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 16, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def test_a_second_turn_reports_its_cached_prompt_and_answers_as_without_the_cache(clients):
    cached, plain = clients
    first = chat(cached, [{"role": "user", "content": Q1}])
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    answer = first["choices"][0]["message"]["content"]
    turns = [{"role": "user", "content": Q1}, {"role": "assistant", "content": answer}, {"role": "user", "content": Q2}]
    second, want = chat(cached, turns), chat(plain, turns)
    assert second["choices"][0]["message"] == want["choices"][0]["message"]
    assert first["usage"]["prompt_tokens"] // 2 < second["usage"]["prompt_tokens_details"]["cached_tokens"] < \
        second["usage"]["prompt_tokens"]
    assert want["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    metrics = cached.get("/metrics").text
    held = next(float(line.split()[-1]) for line in metrics.splitlines()
                if line.startswith("toolkit_cached_prompt_tokens_total"))
    assert held >= second["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_responses_and_messages_report_it_under_their_own_names(clients):
    cached, _ = clients
    body = {"input": Q1, "max_output_tokens": 8, "temperature": 0}
    first = cached.post("/v1/responses", json=body).json()
    again = cached.post("/v1/responses", json={**body, "input": Q2, "previous_response_id": first["id"]}).json()
    assert again["usage"]["input_tokens_details"]["cached_tokens"] > first["usage"]["input_tokens"] // 2
    ask = {"model": "tiny", "max_tokens": 8, "temperature": 0, "system": "Be terse.",
           "messages": [{"role": "user", "content": Q1}]}
    prompt = cached.post("/v1/messages/count_tokens", json=ask).json()["input_tokens"]
    cached.post("/v1/messages", json=ask)
    usage = cached.post("/v1/messages", json=ask).json()["usage"]  # the same prompt again: all but its last token
    assert usage["cache_read_input_tokens"] == prompt - 1 and usage["input_tokens"] == 1


def test_a_negative_row_count_is_refused(capsys):
    assert main(["serve", "--prefix-cache-rows", "-1", "--port", "0"]) == 2
    assert "--prefix-cache-rows must be >= 0" in capsys.readouterr().err
