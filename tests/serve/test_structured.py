"""Structured output served: OpenAI's response_format (json_object, json_schema), vLLM's guided_* and
structured_outputs, SGLang's regex / json_schema / ebnf; the reply is a sentence of the grammar (a choice exactly,
JSON of the schema) on both endpoints, streamed or whole, with speculation; bad constraints are a 400 naming the
field."""
import json

import pytest
from fastapi.testclient import TestClient

MESSAGES = [{"role": "user", "content": "Name a color."}]
SCHEMA = {"type": "object", "properties": {"color": {"enum": ["red", "blue"]}, "n": {"type": "integer",
                                                                                    "minimum": 0, "maximum": 9}},
          "required": ["color", "n"], "additionalProperties": False}


@pytest.fixture(scope="module")
def client(tiny_target, tiny_draft, in_process_app):
    with in_process_app(tiny_target) as (asgi, _), TestClient(asgi) as c:
        yield c


def chat(client, **extra) -> dict:
    r = client.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 40, "temperature": 0, **extra})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


@pytest.mark.parametrize("extra", [{"guided_choice": ["red", "green", "blue"]},
                                   {"structured_outputs": {"choice": ["red", "green", "blue"]}},
                                   {"regex": "(red|green|blue)"}, {"guided_regex": "(red|green|blue)"},
                                   {"ebnf": 'root ::= "red" | "green" | "blue"'}])
def test_a_choice_by_any_name_is_exactly_one_of_them(client, extra):
    c = chat(client, **extra)
    assert c["message"]["content"] in ("red", "green", "blue") and c["finish_reason"] == "stop"


@pytest.mark.parametrize("extra", [{"response_format": {"type": "json_schema", "json_schema": {"name": "c",
                                                                                                "schema": SCHEMA}}},
                                   {"guided_json": SCHEMA}, {"guided_json": json.dumps(SCHEMA)},
                                   {"json_schema": SCHEMA}])
def test_a_schema_gives_json_of_it(client, extra):
    # the random target pads with the whitespace JSON allows between tokens (vLLM's default grammar allows any)
    padded = chat(client, max_tokens=90, **extra)
    assert padded["message"]["content"].startswith("{") and padded["finish_reason"] == "length"
    # without free whitespace (vLLM's disable_any_whitespace) it has to write the object, and ends
    compact = chat(client, max_tokens=90, structured_outputs={"json": SCHEMA, "disable_any_whitespace": True})
    value = json.loads(compact["message"]["content"])
    assert value["color"] in ("red", "blue") and 0 <= value["n"] <= 9 and compact["finish_reason"] == "stop"
    assert "\n" not in compact["message"]["content"]


def test_json_object_streamed_equals_whole_and_completions_take_it_too(client):
    fmt = {"response_format": {"type": "json_object"}}
    whole = chat(client, **fmt)["message"]["content"]
    with client.stream("POST", "/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 40, "temperature": 0,
                                                              "stream": True, **fmt}) as r:
        parts = [c["delta"].get("content") or "" for line in r.iter_lines() if line.startswith("data: {")
                 for c in json.loads(line[6:])["choices"]]
    assert "".join(parts) == whole and whole.lstrip()[:1] in "{[\"-0123456789tfn"
    r = client.post("/v1/completions", json={"prompt": "Color:", "max_tokens": 8, "temperature": 0,
                                             "guided_choice": ["cyan", "magenta"]}).json()
    assert r["choices"][0]["text"] in ("cyan", "magenta")


def test_with_speculation_the_constrained_reply_is_the_same(tiny_target, tiny_draft, serve):
    """The real server with a draft tree: the same constrained replies as the plain in-process engine's."""
    import httpx

    bodies = [{"messages": MESSAGES, "max_tokens": 30, "temperature": 0, "guided_json": SCHEMA},
              {"messages": MESSAGES, "max_tokens": 30, "temperature": 0,
               "structured_outputs": {"json": SCHEMA, "disable_any_whitespace": True}},
              {"messages": MESSAGES, "max_tokens": 30, "temperature": 0, "guided_regex": "[a-z]{3,8}( [a-z]{2,5})+\\."}]
    with serve("--draft", str(tiny_draft), "--num-steps", "3", "--topk", "2", "--num-draft-tokens", "5",
               "--max-seq-len", "256") as (base, _):
        spec = [httpx.post(f"{base}/v1/chat/completions", json=b, timeout=120).json() for b in bodies]
    with serve("--model", str(tiny_target), "--no-speculation", "--max-seq-len", "256") as (base, _):
        plain = [httpx.post(f"{base}/v1/chat/completions", json=b, timeout=120).json() for b in bodies]
    assert [s["choices"][0]["message"] for s in spec] == [p["choices"][0]["message"] for p in plain]
    assert all(s["usage"]["speculative"]["verify_steps"] >= 1 for s in spec)
    assert json.loads(spec[1]["choices"][0]["message"]["content"])["color"] in ("red", "blue")


@pytest.mark.parametrize("extra, param", [
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"response_format": {"type": "yaml"}}, "response_format"),
    ({"guided_regex": "a("}, "guided_regex"), ({"guided_json": "{not json"}, "guided_json"),
    ({"guided_choice": []}, "guided_choice"), ({"ebnf": "root ::= "}, "ebnf"),
    ({"guided_choice": ["a"], "regex": "b"}, "regex"),
    ({"structured_outputs": {"xml": "<a/>"}}, "structured_outputs.xml"),
    ({"structural_tag": {"type": "x"}}, "structural_tag"),
    ({"guided_choice": ["a", "b"], "min_tokens": 3}, "min_tokens"),
    ({"structured_outputs": {"choice": "abc"}}, "structured_outputs.choice"),  # a string is no list of choices
    ({"guided_json": {"type": "array", "uniqueItems": True}}, "guided_json"),  # compiled but not enforced
    ({"guided_json": {"properties": {"d": {"type": "string", "format": "color"}}}}, "guided_json"),
    ({"guided_json": {"type": "string", "pattern": "[a-z]+", "maxLength": 3}}, "guided_json"),
])
def test_bad_constraints_are_refused_by_name(client, extra, param):
    r = client.post("/v1/chat/completions", json={"messages": MESSAGES, **extra})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_a_stop_token_id_the_grammar_needs_stops_the_reply_without_breaking_it(client, tiny_target):
    """A request's stop_token_ids stay text to the grammar (the model's end of turn ends it): the newline the regex
    needs is generated and stops the reply there, as a stop id does (its text kept, as vLLM keeps a stop id that is
    no special token), where it once left no token allowed."""
    from toolkit.data.tokenizer import load_tokenizer

    newline = load_tokenizer(model=str(tiny_target))("\n", add_special_tokens=False).input_ids[0]
    c = chat(client, guided_regex="a\nb", stop_token_ids=[newline])
    assert (c["message"]["content"], c["finish_reason"], c["stop_reason"]) == ("a\n", "stop", newline)


def test_json_object_is_an_object(tiny_target):
    from toolkit.data.tokenizer import load_tokenizer
    import xgrammar as xgr

    from toolkit.infer.grammar import Grammars

    grammars = Grammars(load_tokenizer(model=str(tiny_target)), 49152)
    for compact in (True, False):
        compiled = grammars.compile("json", None, any_whitespace=not compact)
        for text, whole in (('{"a": [1, 2]}', True), ("[1, 2]", False), ("7", False)):
            m = xgr.GrammarMatcher(compiled)
            assert (m.accept_string(text) and m.is_completed()) == whole, (text, compact)


@pytest.mark.parametrize("given", [{"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}},
                                   {"response_format": {"type": "json_object"}}, {"guided_json": SCHEMA}])
def test_disable_any_whitespace_applies_to_every_json_constraint(given):
    """vLLM's structured_outputs.disable_any_whitespace compacts response_format and guided_json too; it was read for
    structured_outputs' own constraints alone."""
    from toolkit.serve.protocol import ChatRequest
    from toolkit.serve.structured import constraint

    body = ChatRequest(messages=MESSAGES, structured_outputs={"disable_any_whitespace": True}, **given)
    assert constraint(body).any_whitespace is False
    assert constraint(ChatRequest(messages=MESSAGES, **given)).any_whitespace is True


def test_a_grammar_and_allowed_ids_with_nothing_left_fail_that_request_alone(client, tiny_target):
    """The choice's word is allowed but not the end of turn it must be followed by: after that token nothing may
    come. That request is a 400 naming both (streamed: the word, then the error), not a made-up token or a failed
    batch; the server answers the next request as before."""
    from toolkit.data.tokenizer import load_tokenizer

    tok = load_tokenizer(model=str(tiny_target))
    red = tok("red", add_special_tokens=False).input_ids
    body = {"messages": MESSAGES, "max_tokens": 10, "temperature": 0, "guided_choice": ["red", "blue"],
            "allowed_token_ids": red}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["code"] == "no_token_allowed", r.text
    said = r.json()["error"]["message"]
    assert f"output token {len(red)}: together, the request's structured output and allowed_token_ids" in said
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    text = "".join(c["delta"].get("content") or "" for e in events for c in e.get("choices", ()))
    assert text in ("", "red") and events[-1]["error"]["code"] == "no_token_allowed"
    assert chat(client, guided_choice=["red", "blue"])["message"]["content"] in ("red", "blue")
