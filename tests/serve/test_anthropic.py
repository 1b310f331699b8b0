"""Anthropic's Messages API on /v1/messages: the same greedy text as chat for the same turns, in the shapes the
anthropic client parses (the message, every stream event); a stream's deltas join to the whole message's blocks;
stop_reason end_turn / max_tokens / stop_sequence / tool_use; tools (any / named calls, tool_result turns fed
back), output_config.format, count_tokens, thinking as the template's enable_thinking, and refusals in Anthropic's
error shape. The real server answers the anthropic client with a draft as without one."""
import json

import pytest
from fastapi.testclient import TestClient

from toolkit.serve.anthropic import MessagesRequest
from toolkit.serve.anthropic_reply import Blocks

TOOLS = [{"name": "get_weather", "description": "The weather in a city",
          "input_schema": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
                           "required": ["city"], "additionalProperties": False}}]
Q = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def client(tools_target, in_process_app):
    with in_process_app(tools_target, max_len=512, tool_parser="hermes") as (asgi, _), TestClient(asgi) as c:
        yield c


def message(client, **body) -> dict:
    from anthropic.types import Message

    r = client.post("/v1/messages", json={"model": "tiny", "max_tokens": 24, "temperature": 0,
                                          "messages": [{"role": "user", "content": Q}], **body})
    assert r.status_code == 200, r.text
    Message.model_validate(r.json())  # the shape the anthropic client parses
    return r.json()


def stream(client, **body) -> list[dict]:
    """Every event, each checked against the anthropic client's event types (ping aside)."""
    from anthropic.types import RawMessageStreamEvent
    from pydantic import TypeAdapter

    adapter, events = TypeAdapter(RawMessageStreamEvent), []
    with client.stream("POST", "/v1/messages", json={"model": "tiny", "max_tokens": 24, "temperature": 0,
                                                     "messages": [{"role": "user", "content": Q}], "stream": True,
                                                     **body}) as r:
        kind = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                event = json.loads(line[6:])
                assert event["type"] == kind
                if kind != "ping":
                    adapter.validate_python(event)
                events.append(event)
    assert [e["type"] for e in events[:2]] == ["message_start", "ping"]
    assert [e["type"] for e in events[-2:]] == ["message_delta", "message_stop"]
    return events


def joined(events: list[dict]) -> list[dict]:
    """A stream's blocks, built from its start and delta events as the anthropic client builds them."""
    blocks = []
    for e in events:
        if e["type"] == "content_block_start":
            assert e["index"] == len(blocks)
            blocks.append(dict(e["content_block"]) | ({"partial": ""} if e["content_block"]["type"] == "tool_use"
                                                      else {}))
        elif e["type"] == "content_block_delta":
            d, b = e["delta"], blocks[e["index"]]
            key = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "partial"}[d["type"]]
            b[key] += d["partial_json" if key == "partial" else key]
    for b in blocks:
        if "partial" in b:
            b["input"] = json.loads(b.pop("partial"))
    return blocks


def chat(client, messages, **extra) -> dict:
    r = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 24, "temperature": 0, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def test_text_equals_chat_and_the_stream_joins_to_the_whole(client):
    system = [{"type": "text", "text": "Answer briefly."}]
    whole = message(client, system=system)
    want = chat(client, [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": Q}])
    assert [b["type"] for b in whole["content"]] == ["text"]
    assert whole["content"][0]["text"] == want["choices"][0]["message"]["content"]
    assert whole["stop_reason"] == {"length": "max_tokens", "stop": "end_turn"}[want["choices"][0]["finish_reason"]]
    assert whole["usage"]["input_tokens"] == want["usage"]["prompt_tokens"]
    assert whole["usage"]["output_tokens"] == want["usage"]["completion_tokens"]
    events = stream(client, system=system)
    assert joined(events) == whole["content"]
    assert events[0]["message"]["usage"]["input_tokens"] == whole["usage"]["input_tokens"]
    assert events[-2]["delta"] == {"stop_reason": whole["stop_reason"], "stop_sequence": None}
    assert events[-2]["usage"]["output_tokens"] == whole["usage"]["output_tokens"]


def test_max_tokens_and_a_stop_sequence_end_the_reply_as_anthropic_says(client):
    cut = message(client, max_tokens=3)
    assert cut["stop_reason"] == "max_tokens" and cut["usage"]["output_tokens"] == 3
    text = message(client, max_tokens=40)["content"][0]["text"]
    word = text.split()[len(text.split()) // 2]  # a word the greedy reply writes, so it stops there
    stopped = message(client, max_tokens=40, stop_sequences=["@@never@@", word])
    assert stopped["stop_reason"] == "stop_sequence" and stopped["stop_sequence"] == word
    assert text.startswith(stopped["content"][0]["text"]) and word not in stopped["content"][0]["text"]
    assert stream(client, max_tokens=40, stop_sequences=[word])[-2]["delta"] == {"stop_reason": "stop_sequence",
                                                                                 "stop_sequence": word}


@pytest.mark.parametrize("choice", [{"type": "any", "disable_parallel_tool_use": True},
                                    {"type": "tool", "name": "get_weather"}])
def test_tool_use_blocks_and_tool_results_fed_back_are_chats(client, choice):
    first = message(client, tools=TOOLS, tool_choice=choice, max_tokens=60)
    call = first["content"][-1]
    assert first["stop_reason"] == "tool_use" and call["type"] == "tool_use" and call["name"] == "get_weather"
    assert call["input"]["city"] in ("Paris", "Rome")
    events = stream(client, tools=TOOLS, tool_choice=choice, max_tokens=60)
    assert [{k: v for k, v in b.items() if k != "id"} for b in joined(events)] == [
        {k: v for k, v in b.items() if k != "id"} for b in first["content"]]
    assert events[-2]["delta"]["stop_reason"] == "tool_use"
    # the call and its result go back in: the reply is chat's for the same turns
    turns = [{"role": "user", "content": Q}, {"role": "assistant", "content": first["content"]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "Sunny"},
                                          {"type": "text", "text": "And tomorrow?"}]}]
    after = message(client, tools=TOOLS, tool_choice={"type": "none"}, messages=turns)
    chat_tools = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                    "parameters": t["input_schema"]}} for t in TOOLS]
    want = chat(client, [{"role": "user", "content": Q},
                         {"role": "assistant", "content": None, "tool_calls": [
                             {"id": call["id"], "type": "function",
                              "function": {"name": "get_weather", "arguments": json.dumps(call["input"])}}]},
                         {"role": "tool", "tool_call_id": call["id"], "content": "Sunny"},
                         {"role": "user", "content": "And tomorrow?"}], tools=chat_tools, tool_choice="none")
    assert after["content"][0]["text"] == want["choices"][0]["message"]["content"]


def test_an_output_format_is_chats_response_format(client):
    schema = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
              "additionalProperties": False}
    reply = message(client, max_tokens=60, output_config={"format": {"type": "json_schema", "schema": schema}})
    held = chat(client, [{"role": "user", "content": Q}], max_tokens=60, response_format={
        "type": "json_schema", "json_schema": {"name": "output", "schema": schema}})["choices"][0]["message"]
    assert reply["content"][0]["text"] == held["content"] and held["content"].lstrip().startswith("{")


def test_count_tokens_is_the_prompt_a_message_bills(client):
    body = {"model": "tiny", "system": "Answer briefly.", "tools": TOOLS,
            "messages": [{"role": "user", "content": [{"type": "text", "text": Q}]}]}
    r = client.post("/v1/messages/count_tokens", json=body)
    assert r.status_code == 200, r.text
    assert r.json() == {"input_tokens": message(client, **body, tool_choice={"type": "none"})["usage"]["input_tokens"]}


def test_a_last_assistant_turn_is_a_prefill_the_reply_continues(client):
    """Anthropic's prefill: the reply goes on from the assistant's text (chat's continue_final_message), whole,
    streamed and counted, where it was a 400 asking for chat-only fields."""
    turns = [{"role": "user", "content": Q}, {"role": "assistant", "content": "The weather in Paris is"}]
    reply = message(client, messages=turns)
    want = chat(client, turns, continue_final_message=True, add_generation_prompt=False)
    assert reply["content"][0]["text"] == want["choices"][0]["message"]["content"]
    assert reply["usage"]["input_tokens"] == want["usage"]["prompt_tokens"]
    assert joined(stream(client, messages=turns)) == reply["content"]
    r = client.post("/v1/messages/count_tokens", json={"model": "tiny", "messages": turns})
    assert r.json() == {"input_tokens": want["usage"]["prompt_tokens"]}


def test_thinking_sets_the_templates_enable_thinking():
    for kind, on in (("enabled", True), ("adaptive", True), ("disabled", False)):
        body = MessagesRequest(messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                               thinking={"type": kind, "budget_tokens": 1024})
        assert body.chat()["chat_template_kwargs"] == {"enable_thinking": on}
    assert "chat_template_kwargs" not in MessagesRequest(messages=[{"role": "user", "content": "Hi"}]).chat()


def test_thinking_text_and_calls_become_blocks_in_order():
    blocks = Blocks()
    events = blocks.feed({"reasoning_content": "Let me"}) + blocks.feed({"reasoning_content": " see."})
    events += blocks.feed({"content": "Calling."})
    events += blocks.feed({"tool_calls": [{"index": 0, "id": "call_1", "function": {"name": "f", "arguments": ""}}]})
    events += blocks.feed({"tool_calls": [{"index": 0, "function": {"arguments": '{"a": '}}]})
    events += blocks.feed({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]})
    events += blocks.close()
    assert blocks.blocks == [{"type": "thinking", "thinking": "Let me see.", "signature": ""},
                             {"type": "text", "text": "Calling."},
                             {"type": "tool_use", "id": "call_1", "name": "f", "input": {"a": 1}}]
    assert joined(events) == blocks.blocks
    assert [e["type"] for e in events if e["type"] != "content_block_delta"] == [
        "content_block_start", "content_block_stop"] * 2 + ["content_block_start", "content_block_stop"]


@pytest.mark.parametrize("extra, status, message_has", [
    ({"max_tokens": None}, 400, "max_tokens: required"),
    ({"model": "claude-made-up"}, 404, "claude-made-up"),
    ({"messages": [{"role": "system", "content": "x"}]}, 400, "messages.0.role"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, 400, "'image'"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, 400, "tools.0"),
    ({"tool_choice": {"type": "sometimes"}, "tools": TOOLS}, 400, "tool_choice"),
    ({"tool_choice": {"type": "any"}}, 400, "tool_choice"),  # a call asked for, no tools to call
    ({"container": "c1"}, 400, "container"),
    ({"output_config": {"effort": "high"}}, 400, "output_config.effort"),
    ({"output_config": {"format": {"type": "xml"}}}, 400, "output_config.format"),
    ({"output_config": {"format": "json"}}, 400, "output_config.format"),  # was a 500 in plain text
    ({"tools": [{"name": "f", "input_schema": "x"}]}, 400, "tools.0.input_schema: give"),  # not chat's names
    ({"tools": [{"name": "a b"}]}, 400, "tools.0.name: give"),
    ({"thinking": {"type": "sometimes"}}, 400, "thinking.type"),
    ({"stop_sequences": ["x" * 2000]}, 400, "stop_sequences"),
    ({"temperature": -1}, 400, "temperature"),
])
def test_refusals_are_in_anthropics_shape(client, extra, status, message_has):
    body = {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": Q}], **extra}
    r = client.post("/v1/messages", json={k: v for k, v in body.items() if v is not None})
    assert r.status_code == status, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == {400: "invalid_request_error",
                                                               404: "not_found_error"}[status]
    assert message_has in err["error"]["message"], err


def test_every_error_on_a_messages_path_is_in_anthropics_shape(client):
    """An unknown Messages path (404), a wrong method (405), a body over the limit (413, the gate's) and a query
    parameter of the wrong type (FastAPI's 422 {"detail": ...}, now a 400) came in OpenAI's shape or FastAPI's;
    the anthropic client reads {"type": "error", "error": {"type", "message"}}. Other paths keep OpenAI's."""
    cases = [(client.post("/v1/messages/nothing", json={}), 404, "not_found_error"),
             (client.get("/v1/messages"), 405, "api_error"),
             (client.post("/v1/messages", content=b"{" + b" " * 70_000 + b"}"), 413, "request_too_large"),
             (client.get("/v1/messages/batches?limit=abc"), 400, "invalid_request_error")]
    for r, status, kind in cases:
        assert r.status_code == status and r.json()["type"] == "error", r.text
        assert r.json()["error"]["type"] == kind and r.json()["error"]["message"], r.text
    r = client.get("/v1/files?limit=abc")
    assert r.status_code == 400 and r.json()["error"]["param"] == "limit", r.text


def test_message_start_counts_the_prefix_cache_as_the_message_does(tiny_target, in_process_app):
    """The same prompt streamed twice: the second's message_start said every prompt token was input (it went out
    before admission), message_delta and the whole message that the prefix cache held some; now all three agree."""
    body = {"model": "tiny", "max_tokens": 6, "temperature": 0, "messages": [{"role": "user", "content": Q}]}
    with in_process_app(tiny_target, prefix_cache_rows=4) as (asgi, _), TestClient(asgi) as c:
        for _ in range(2):
            events = stream(c, **body)
        start, delta = events[0]["message"]["usage"], events[-2]["usage"]
        assert start["cache_read_input_tokens"] > 0
        assert (start["input_tokens"], start["cache_read_input_tokens"]) == (delta["input_tokens"],
                                                                             delta["cache_read_input_tokens"])


def test_message_start_goes_out_at_admission_while_a_parser_holds_the_text(tools_target, in_process_app):
    """A forced tool call's text is held by the tool parser until the call closes: message_start waited for the
    first shown text, so a client saw nothing for the whole generation. It goes out with the first update (each
    engine step slowed to 0.06 s here: the call takes many steps, message_start comes within the first few)."""
    import time

    with in_process_app(tools_target, max_len=512, tool_parser="hermes") as (asgi, engine), TestClient(asgi) as c:
        step = engine.step
        engine.step = lambda *a, **k: (time.sleep(0.06), step(*a, **k))[1]
        t0, seen = time.perf_counter(), {}
        with c.stream("POST", "/v1/messages", json={"model": "tiny", "max_tokens": 60, "temperature": 0, "messages": [
                {"role": "user", "content": Q}], "tools": TOOLS, "tool_choice": {"type": "any"}, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("event: "):
                    seen.setdefault(line[7:], time.perf_counter() - t0)
    assert seen["content_block_start"] > 1.5, seen  # the call is written over 25 steps or more
    assert seen["message_start"] < seen["content_block_start"] - 1.0, seen


def test_the_anthropic_client_gets_the_same_answer_with_a_draft(tiny_target, tiny_draft, serve):
    """The real server, anthropic's client (create, stream, count_tokens): a draft tree's answer is plain decoding's."""
    import anthropic

    def answers(*args) -> tuple[str, str, int]:
        with serve(*args, "--max-seq-len", "256", "--api-key", "sk-test") as (base, _):
            client = anthropic.Anthropic(base_url=base, api_key="sk-test")
            turns, greedy = [{"role": "user", "content": Q}], {"temperature": 0}  # newer clients take no temperature
            whole = client.messages.create(model="tiny-target", max_tokens=20, messages=turns, extra_body=greedy)
            with client.messages.stream(model="tiny-target", max_tokens=20, messages=turns, extra_body=greedy) as s:
                text = "".join(s.text_stream)
                final = s.get_final_message()
            assert final.content[0].text == text and final.stop_reason == whole.stop_reason
            assert client.messages.count_tokens(model="tiny-target", messages=turns).input_tokens == \
                whole.usage.input_tokens == final.usage.input_tokens + final.usage.cache_read_input_tokens
            assert final.usage.cache_read_input_tokens > 0  # the same prompt again: the prefix cache held it
            with pytest.raises(anthropic.AuthenticationError):
                anthropic.Anthropic(base_url=base, api_key="sk-wrong").messages.create(
                    model="tiny-target", max_tokens=2, messages=turns)
            return whole.content[0].text, text, whole.usage.model_extra["speculative"]["verify_steps"]

    spec = answers("--draft", str(tiny_draft), "--num-steps", "3", "--topk", "2", "--num-draft-tokens", "5",
                   "--served-model-name", "tiny-target")
    plain = answers("--model", str(tiny_target), "--no-speculation", "--served-model-name", "tiny-target")
    assert spec[:2] == plain[:2] and spec[0] == spec[1] and spec[2] >= 1


def test_messages_become_chat_turns_in_order():
    from toolkit.serve.anthropic import chat_messages

    turns = chat_messages([
        {"role": "user", "content": [{"type": "text", "text": "Weather?", "cache_control": {"type": "ephemeral"}}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                                          {"type": "text", "text": "Checking."},
                                          {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}},
                                          {"type": "tool_use", "id": "t2", "name": "g", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"},
                                     {"type": "tool_result", "tool_use_id": "t2", "is_error": True,
                                      "content": [{"type": "text", "text": "no such city"}]},
                                     {"type": "text", "text": "Thanks."}]},
        {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"}, {"type": "text", "text": "Ok"}]}])
    assert turns == [
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Checking."}], "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
            {"id": "t2", "type": "function", "function": {"name": "g", "arguments": "{}"}}],
         "reasoning_content": "hm"},  # the thinking kept for the template (redacted thinking is not)
        {"role": "tool", "tool_call_id": "t1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "t2", "content": "Error: no such city"},
        {"role": "user", "content": [{"type": "text", "text": "Thanks."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Ok"}]}]
    only_results = chat_messages([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]}])
    assert only_results == [{"role": "tool", "tool_call_id": "t1", "content": ""}]  # no empty user turn after it
