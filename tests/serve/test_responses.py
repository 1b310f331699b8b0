"""OpenAI's Responses API on /v1/responses: the same greedy text as chat for the same turns, in the shapes the openai
client parses (each stream event, the final response); streamed events join to the whole response's items;
instructions, function tools (required / named calls, results fed back), text.format json_schema, max_output_tokens
(status incomplete), previous_response_id over stored responses (GET / DELETE / input_items too), and refusals
naming the Responses field. The real server answers openai's client.responses with a draft as without one."""
import json

import pytest
from fastapi.testclient import TestClient


TOOLS = [{"type": "function", "name": "get_weather", "description": "The weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
                         "required": ["city"], "additionalProperties": False}}]
Q = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def client(tools_target, in_process_app):
    with in_process_app(tools_target, max_len=512, tool_parser="hermes") as (asgi, _), TestClient(asgi) as c:
        yield c


def respond(client, **body) -> dict:
    from openai.types.responses import Response

    r = client.post("/v1/responses", json={"input": Q, "max_output_tokens": 24, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    Response.model_validate(r.json())  # the shape the openai client parses
    return r.json()


def stream(client, **body) -> tuple[list[dict], dict]:
    """Every event (each checked against the openai client's event types), and the final response."""
    from openai.types.responses import ResponseStreamEvent
    from pydantic import TypeAdapter

    adapter, events = TypeAdapter(ResponseStreamEvent), []
    with client.stream("POST", "/v1/responses", json={"input": Q, "max_output_tokens": 24, "temperature": 0,
                                                      "stream": True, **body}) as r:
        kind = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                event = json.loads(line[6:])
                assert event["type"] == kind
                adapter.validate_python(event)
                events.append(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
    return events, events[-1]["response"]


def chat_text(client, messages, **extra) -> str:
    r = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 24, "temperature": 0, **extra})
    return r.json()["choices"][0]["message"]["content"]


def output_text(response: dict) -> str:
    return "".join(p["text"] for i in response["output"] if i["type"] == "message" for p in i["content"])


def test_text_equals_chat_and_the_stream_joins_to_the_whole(client):
    whole = respond(client, instructions="Answer briefly.")
    assert whole["object"] == "response" and whole["status"] in ("completed", "incomplete")
    assert output_text(whole) == chat_text(client, [{"role": "system", "content": "Answer briefly."},
                                                    {"role": "user", "content": Q}])
    assert whole["usage"]["input_tokens"] > 0 and whole["usage"]["output_tokens"] > 0
    assert whole["usage"]["total_tokens"] == whole["usage"]["input_tokens"] + whole["usage"]["output_tokens"]
    events, final = stream(client, instructions="Answer briefly.")
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == output_text(final) == output_text(whole)
    assert [i["type"] for i in final["output"]] == ["message"]
    assert events[-1]["type"] == f"response.{final['status']}" and final["usage"] == {
        **whole["usage"], "speculative": final["usage"]["speculative"]}


def test_input_tokens_counts_the_prompt_a_response_reads(client):
    """OpenAI's POST /v1/responses/input_tokens (the SDK's responses.input_tokens.count; a 405 before): the
    instructions, tools and input as the reply's prompt counts them, in the SDK's shape."""
    from openai.types.responses import InputTokenCountResponse

    tools = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
    body = {"input": Q, "instructions": "Answer briefly.", "tools": tools, "tool_choice": "none"}
    r = client.post("/v1/responses/input_tokens", json=body)
    assert r.status_code == 200, r.text
    counted = InputTokenCountResponse.model_validate(r.json())
    assert counted.object == "response.input_tokens"
    assert counted.input_tokens == respond(client, **body)["usage"]["input_tokens"]
    bare = client.post("/v1/responses/input_tokens", json={"input": Q}).json()["input_tokens"]
    assert 0 < bare < counted.input_tokens  # the instructions and tools take tokens too
    after = client.post("/v1/responses/input_tokens", json={"input": Q, "previous_response_id": respond(client)["id"]})
    assert after.json()["input_tokens"] > 2 * bare  # a previous response's turns come first


def test_max_output_tokens_cuts_the_reply_as_incomplete(client):
    whole = respond(client, max_output_tokens=3, input=[{"role": "user", "content": [
        {"type": "input_text", "text": "Write a long story about a dragon."}]}])
    assert whole["status"] == "incomplete" and whole["incomplete_details"] == {"reason": "max_output_tokens"}
    assert whole["usage"]["output_tokens"] == 3 and whole["output"][0]["status"] == "incomplete"


def test_required_and_named_tools_give_function_calls_and_results_go_back_in(client):
    whole = respond(client, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_output_tokens=60)
    calls = [i for i in whole["output"] if i["type"] == "function_call"]
    assert len(calls) == 1 and calls[0]["name"] == "get_weather" and calls[0]["status"] == "completed"
    assert json.loads(calls[0]["arguments"])["city"] in ("Paris", "Rome") and whole["status"] == "completed"
    events, final = stream(client, tools=TOOLS, tool_choice={"type": "function", "name": "get_weather"},
                           max_output_tokens=40)
    call = [i for i in final["output"] if i["type"] == "function_call"][0]
    args = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    assert args == call["arguments"] and json.loads(args)["city"] in ("Paris", "Rome")
    done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert [(d["name"], d["arguments"]) for d in done] == [("get_weather", call["arguments"])]
    # the call and its result fed back as input items render as chat's tool_calls and tool turns do
    items = [{"role": "user", "content": Q}, {"type": "function_call", "call_id": "call_1", "name": "get_weather",
                                               "arguments": '{"city": "Paris"}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 21 C"}]
    after = respond(client, input=items, tools=TOOLS, tool_choice="none")
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    nested = [{"type": "function", "function": {k: v for k, v in TOOLS[0].items() if k != "type"}}]
    assert output_text(after) == chat_text(client, [
        {"role": "user", "content": Q}, {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}], tools=nested, tool_choice="none")


def test_a_json_schema_format_is_chats_response_format(client):
    schema = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
              "additionalProperties": False}
    fmt = {"type": "json_schema", "name": "city", "schema": schema, "strict": True}
    whole = respond(client, max_output_tokens=60, text={"format": fmt})
    held = chat_text(client, [{"role": "user", "content": Q}], max_tokens=60, response_format={
        "type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": True}})
    assert output_text(whole) == held and held.lstrip().startswith('{')  # the random target pads with whitespace
    assert whole["text"]["format"] == fmt


def test_previous_response_id_continues_a_stored_response(client):
    first = respond(client, instructions="Be terse.")
    second = respond(client, previous_response_id=first["id"], input="And in Rome?")
    # the first turn, its answer, then the new turn; the instructions are not carried over (OpenAI's rule)
    assert output_text(second) == chat_text(client, [{"role": "user", "content": Q},
                                                     {"role": "assistant", "content": output_text(first)},
                                                     {"role": "user", "content": "And in Rome?"}])
    assert second["previous_response_id"] == first["id"]
    assert client.get(f"/v1/responses/{first['id']}").json() == first
    assert client.delete(f"/v1/responses/{first['id']}").json() == {"id": first["id"], "object": "response.deleted",
                                                                    "deleted": True}
    gone = client.get(f"/v1/responses/{first['id']}")
    assert gone.status_code == 404 and "no stored response" in gone.json()["error"]["message"]
    r = client.post("/v1/responses", json={"input": "Hi", "previous_response_id": first["id"]})
    assert r.status_code == 404 and r.json()["error"]["param"] == "previous_response_id"
    unstored = respond(client, store=False)
    assert client.get(f"/v1/responses/{unstored['id']}").status_code == 404
    metrics = client.get("/metrics").text  # counted by route, not by response id
    endpoints = {line.split('endpoint="')[1].split('"')[0] for line in metrics.splitlines()
                 if line.startswith("toolkit_requests_total{")}
    assert {"/v1/responses", "/v1/responses/{id}"} <= endpoints and not any("resp_" in e for e in endpoints)


def test_input_items_lists_a_stored_responses_input_in_pages(client):
    from openai.types.responses.response_item_list import ResponseItemList

    def listed(rid, **query) -> dict:
        r = client.get(f"/v1/responses/{rid}/input_items", params=query)
        assert r.status_code == 200, r.text
        ResponseItemList.model_validate(r.json())  # what client.responses.input_items.list pages
        return r.json()

    plain = respond(client)
    [item] = listed(plain["id"])["data"]
    assert item["type"] == "message" and item["role"] == "user" and item["content"] == [
        {"type": "input_text", "text": Q}] and item["id"].startswith("msg_")
    given = [{"role": "user", "content": Q},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
             {"role": "assistant", "content": [{"type": "output_text", "text": "It is sunny."}]},
             {"role": "user", "content": [{"type": "input_text", "text": "And tomorrow?"}]}]
    rid = respond(client, input=given, tools=TOOLS, tool_choice="none")["id"]
    asc = listed(rid, order="asc")
    assert [i["type"] for i in asc["data"]] == ["message", "function_call", "function_call_output", "message",
                                                "message"] and asc["has_more"] is False
    assert asc["data"][1]["call_id"] == "call_1" and asc["data"][2]["output"] == "sunny"
    assert asc["data"][3]["content"] == [{"type": "output_text", "text": "It is sunny.", "annotations": []}]
    assert listed(rid)["data"] == asc["data"][::-1]  # newest first by default, as OpenAI lists them
    first = listed(rid, order="asc", limit=2)
    assert first["has_more"] and [i["id"] for i in first["data"]] == [first["first_id"], first["last_id"]]
    rest = listed(rid, order="asc", after=first["last_id"], limit=10)
    assert first["data"] + rest["data"] == asc["data"] and rest["has_more"] is False
    for query, param in (({"order": "up"}, "order"), ({"limit": 0}, "limit"), ({"limit": "x"}, "limit"),
                         ({"after": "msg_nope"}, "after")):
        r = client.get(f"/v1/responses/{rid}/input_items", params=query)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert client.get("/v1/responses/resp_nope/input_items").status_code == 404


@pytest.mark.parametrize("extra, param, message", [
    ({"tools": [{"type": "web_search"}]}, "tools.0", "only function tools"),
    ({"background": True}, "background", "not supported"),
    ({"reasoning": {"effort": "max"}}, "reasoning.effort", "reasoning.effort 'max': give one of low, medium, high"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input.0.content.0",
     "only text parts"),
    ({"input": [{"type": "file_search_call"}]}, "input.0", "not served"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input.0", "needs call_id, name and"),
    ({"input": [{"role": "user", "content": Q}, {"type": "function_call", "call_id": "c", "name": "f",
                                                 "arguments": "[1]"}]}, "input.1.arguments", "JSON object"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format", "json_schema"),
    ({"text": {"format": "json_object"}}, "text.format", "give an object"),
    ({"tools": [{"type": "function", "name": "a b"}]}, "tools.0.name", "tools.0.name: give"),  # not chat's name  # these two were 500s in plain text
    ({"input": [{"type": "reasoning", "content": 5}, {"role": "user", "content": Q}]}, "input.0.content",
     "reasoning_text parts"),
    ({"max_output_tokens": 10 ** 6}, "max_output_tokens", "max_output_tokens"),
    ({"tool_choice": "required"}, "tool_choice", "tools"),
    ({"model": "other"}, "model", "does not exist"),
])
def test_what_is_not_served_is_refused_naming_the_field(client, extra, param, message):
    r = client.post("/v1/responses", json={"input": Q, **extra})
    assert r.status_code in (400, 404), r.text
    err = r.json()["error"]
    assert err["param"] == param and message in err["message"], err


def test_the_openai_client_gets_the_same_answer_with_a_draft(tiny_target, tiny_draft, serve):
    """The real server, openai's client.responses (whole and streamed): a draft tree's answer is plain decoding's."""
    from openai import OpenAI

    def answers(*args) -> tuple[str, str, int]:
        with serve(*args, "--max-seq-len", "256") as (base, _):
            client = OpenAI(base_url=f"{base}/v1", api_key="unused")
            whole = client.responses.create(model=client.models.list().data[0].id,
                                            input=Q, max_output_tokens=20, temperature=0)
            events = list(client.responses.create(model=whole.model, input=Q, max_output_tokens=20, temperature=0,
                                                  stream=True))
            text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
            final = events[-1].response  # response.incomplete here: 20 tokens cut the answer
            assert events[-1].type == f"response.{final.status}" and final.output_text == text
            assert [i.content[0].text for i in client.responses.input_items.list(whole.id)] == [Q]
            return whole.output_text, text, whole.usage.model_extra["speculative"]["verify_steps"]

    spec = answers("--draft", str(tiny_draft), "--num-steps", "3", "--topk", "2", "--num-draft-tokens", "5")
    plain = answers("--model", str(tiny_target), "--no-speculation")
    assert spec[:2] == plain[:2] and spec[0] == spec[1] and spec[2] >= 1


def test_reasoning_effort_is_served_as_chats_and_echoed(client):
    """reasoning.effort is chat's reasoning_effort (the template's variable; this target's template reads none, so
    the text is the same) and the response says the effort it was asked with."""
    from toolkit.serve.responses import ResponsesRequest

    assert ResponsesRequest(input=Q, reasoning={"effort": "low"}).chat([])["reasoning_effort"] == "low"
    low, plain = respond(client, reasoning={"effort": "low"}), respond(client)
    assert low["reasoning"]["effort"] == "low" and plain["reasoning"]["effort"] is None
    assert output_text(low) == output_text(plain)
