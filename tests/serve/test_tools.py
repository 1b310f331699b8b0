"""Tools served on /v1/chat/completions as OpenAI's API and vLLM serve them: the template shows the functions,
tool_choice required / named hold the reply to calls of the given schemas (finish_reason tool_calls / stop), auto
reads the reply with --tool-call-parser, history turns with calls and tool results render through the template,
streamed deltas merge to the whole message, and bad tools or choices are a 400 naming the field."""
import json

import pytest
from fastapi.testclient import TestClient


TOOLS = [{"type": "function", "function": {
             "name": "get_weather", "description": "The weather in a city",
             "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]},
                                                             "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                            "required": ["city", "days"], "additionalProperties": False}}},
         {"type": "function", "function": {
             "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"enum": ["CET", "UTC"]}},
                                                "required": ["zone"], "additionalProperties": False}}}]
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
ADDR = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
        "additionalProperties": False}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}\n</tool_call>'


@pytest.fixture(scope="module")
def client(tools_target, in_process_app):
    with in_process_app(tools_target, max_len=512, tool_parser="hermes") as (asgi, _), TestClient(asgi) as c:
        yield c


def post(client, **extra):
    return client.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 60, "temperature": 0,
                                                     "tools": TOOLS, **extra})


def streamed(client, **extra) -> tuple[dict, str]:
    """The stream's deltas merged as OpenAI's client merges them, and the last finish_reason."""
    from openai.types.chat import ChatCompletionChunk

    msg, calls, reason = {"content": ""}, {}, None
    with client.stream("POST", "/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 60, "temperature": 0,
                                                              "tools": TOOLS, "stream": True, **extra}) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            ChatCompletionChunk.model_validate(chunk)  # each chunk in the shape the openai client parses
            for c in chunk["choices"]:
                msg["content"] += c["delta"].get("content") or ""
                for d in c["delta"].get("tool_calls", []):
                    call = calls.setdefault(d["index"], {"id": d.get("id"), "type": "function",
                                                         "function": {"name": "", "arguments": ""}})
                    call["function"]["name"] += d["function"].get("name", "")
                    call["function"]["arguments"] += d["function"].get("arguments", "")
                reason = c["finish_reason"] or reason
    msg["content"] = msg["content"] or None
    return msg | ({"tool_calls": [calls[i] for i in sorted(calls)]} if calls else {}), reason


def sending(name: str, addr: dict = ADDR, key: str = "$defs") -> dict:
    """A tool whose parameters name a nested model by $ref, as openai.pydantic_function_tool() writes them."""
    return {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", key: {"Addr": addr}, "properties": {"to": {"$ref": f"#/{key}/Addr"}}, "required": ["to"],
        "additionalProperties": False}}}


def calls_of(message: dict) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls", [])]


def valid(name: str, args: dict) -> bool:
    if name == "get_weather":
        return set(args) == {"city", "days"} and args["city"] in ("Paris", "Rome") and 1 <= args["days"] <= 7
    return name == "get_time" and args in ({"zone": "CET"}, {"zone": "UTC"})


def test_required_gives_calls_of_the_schemas_whole_and_streamed(client):
    from openai.types.chat import ChatCompletion

    r = post(client, tool_choice="required", parallel_tool_calls=False)
    assert r.status_code == 200, r.text
    assert ChatCompletion.model_validate(r.json()).choices[0].message.tool_calls[0].function.name  # the client's shape
    choice = r.json()["choices"][0]
    calls = calls_of(choice["message"])
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert len(calls) == 1 and valid(*calls[0])  # one call at most without parallel calls
    assert all(set(c) == {"id", "type", "function"} and c["id"].startswith("chatcmpl-tool-")
               for c in choice["message"]["tool_calls"])
    msg, reason = streamed(client, tool_choice="required", parallel_tool_calls=False)
    assert calls_of(msg) == calls and msg["content"] is None and reason == "tool_calls"
    # with parallel calls the random target writes call after call until max_tokens: a cut array is no call, and
    # the text is returned as written
    cut = post(client, tool_choice="required").json()["choices"][0]
    assert cut["finish_reason"] == "length" and "tool_calls" not in cut["message"]
    assert cut["message"]["content"].startswith('[{"name": "get_')


def test_required_lifts_the_tools_defs_to_the_root_their_refs_point_at(client):
    """required nests each tool's schema in the calls' array, where "#/$defs/Addr" would resolve against the array:
    the tools' $defs (and definitions) go to its root, as vLLM lifts them; the request's tools are left as sent."""
    from toolkit.serve.tools import ToolChoice

    tools = [sending("send"), sending("forward"), sending("mail", key="definitions")]
    sent = json.dumps(tools)
    r = post(client, tools=tools, tool_choice="required", parallel_tool_calls=False)
    assert r.status_code == 200, r.text
    [(name, args)] = calls_of(r.json()["choices"][0]["message"])
    assert name in ("send", "forward", "mail") and args == {"to": {"city": args["to"]["city"]}}
    assert args["to"]["city"] in ("Paris", "Rome") and json.dumps(tools) == sent
    _, schema = ToolChoice("required").constraint(tools)
    assert schema["$defs"] == schema["definitions"] == {"Addr": ADDR}
    assert not any(k in call["properties"]["parameters"] for call in schema["items"]["anyOf"]
                   for k in ("$defs", "definitions"))


def test_a_named_function_gets_arguments_of_its_schema(client):
    named = {"type": "function", "function": {"name": "get_time"}}
    choice = post(client, tool_choice=named).json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"] is None  # OpenAI's reason when named
    [(name, args)] = calls_of(choice["message"])
    assert name == "get_time" and valid(name, args)
    msg, reason = streamed(client, tool_choice=named)
    assert calls_of(msg) == [(name, args)] and reason == "stop"


def test_auto_reads_the_reply_with_the_parser(client):
    """The random target would not write a call on its own: a regex makes it write one, the parser reads it."""
    forced = {"guided_regex": "Sure\\.\n" + CALL.replace("{", "\\{").replace("}", "\\}"), "max_tokens": 100}
    choice = post(client, **forced).json()["choices"][0]  # no tool_choice: auto, as tools mean
    assert choice["message"]["content"] == "Sure.\n" and choice["finish_reason"] == "tool_calls"
    assert calls_of(choice["message"]) == [("get_weather", {"city": "Rome", "days": 2})]
    msg, reason = streamed(client, tool_choice="auto", **forced)
    assert msg["content"] == "Sure.\n" and calls_of(msg) == calls_of(choice["message"]) and reason == "tool_calls"
    plain = post(client, tool_choice="auto", max_tokens=12).json()["choices"][0]  # no call written: content
    assert "tool_calls" not in plain["message"] and plain["finish_reason"] in ("stop", "length")
    assert post(client, tool_choice="none", **forced).json()["choices"][0]["message"]["content"] == "Sure.\n" + CALL


def test_the_template_shows_tools_and_renders_calls_and_results(client):
    history = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 1}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]
    r = client.post("/tokenize", json={"messages": history, "tools": TOOLS})
    assert r.status_code == 200, r.text
    text = client.post("/detokenize", json={"tokens": r.json()["tokens"]}).json()["prompt"]
    assert '"name": "get_weather", "description": "The weather in a city"' in text  # the tools, in the system turn
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 1}}\n</tool_call>' in text
    assert "<tool_response>\n18 C, sunny\n</tool_response>" in text and text.endswith("<|im_start|>assistant\n")
    r = client.post("/v1/chat/completions", json={"messages": history, "tools": TOOLS, "tool_choice": "none",
                                                  "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == len(
        client.post("/tokenize", json={"messages": history, "tools": TOOLS}).json()["tokens"])


@pytest.mark.parametrize("extra, param, message", [
    ({"tools": [{"type": "retrieval"}]}, "tools[0]", "function tools are the kind served"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name", "1-64 letters"),
    ({"tools": TOOLS + TOOLS[:1]}, "tools[2].function.name", "defined twice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]}, "tools[0].function.parameters",
     "JSON schema object"),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "not among the tools"),
    ({"tool_choice": "sometimes"}, "tool_choice", 'accepted "none", "auto", "required"'),
    ({"tools": None, "tool_choice": "required"}, "tool_choice", '"required" needs tools'),
    ({"tools": [sending("send"), sending("forward", {"type": "string"})], "tool_choice": "required"},
     "tools[1].function.parameters", "$defs.Addr: 'forward' defines 'Addr' differently"),  # vLLM refuses it too
    ({"tool_choice": "required", "guided_json": {"type": "object"}}, "guided_json", "constrains the reply"),
    ({"tool_choice": "required", "min_tokens": 2}, "min_tokens", "structured-output constraint"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]},
                   {"role": "user", "content": "hi"}]}, "messages.0.tool_calls.0.function.arguments", "not JSON"),
    ({"messages": [{"role": "user", "content": "hi", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}]},
     "messages.0", "has no tool_calls"),
    ({"messages": [{"role": "tool", "content": None}]}, "messages.0", "needs content")])
def test_bad_tools_and_choices_are_refused_naming_the_field(client, extra, param, message):
    r = post(client, **extra)
    assert r.status_code == 400 and r.json()["error"]["param"] == param and message in r.json()["error"]["message"]


def test_auto_without_a_parser_is_refused_as_vllm_does(tools_target, in_process_app):
    with in_process_app(tools_target, max_len=512) as (asgi, _), TestClient(asgi) as plain:
        r = post(plain)  # tools without tool_choice: auto
        assert r.status_code == 400 and "--enable-auto-tool-choice" in r.json()["error"]["message"]
        assert post(plain, tool_choice="required", max_tokens=100).status_code == 200  # needs no parser
        assert post(plain, tool_choice="none", max_tokens=4).status_code == 200


def test_tags_that_are_special_tokens_reach_the_parser(qwen2_tokenizer):
    """In Qwen2's tokenizer <tool_call> is a special token: text decoded without special tokens loses it, so the
    parser's tags are kept (and the other special tokens still dropped)."""
    from toolkit.serve.text import TextStream, shown_ids
    from toolkit.serve.tool_calls import TAGS

    tok = qwen2_tokenizer
    ids = tok.convert_tokens_to_ids(["<tool_call>"]) + tok('{"name": "f"}', add_special_tokens=False).input_ids
    ids += tok.convert_tokens_to_ids(["</tool_call>", "<|im_end|>"])
    keep = shown_ids(tok, TAGS["hermes"])
    assert len(keep) == 2 and shown_ids(tok, TAGS["llama3_json"]) == frozenset()
    assert TextStream(tok, []).update(ids, True) == '{"name": "f"}'
    assert TextStream(tok, [], keep=keep).update(ids, True) == '<tool_call>{"name": "f"}</tool_call>'


def test_with_speculation_the_calls_are_the_same(tiny_target, tiny_draft, serve):
    """The real server (its --chat-template and tool flags) with a draft tree: the same calls and text as plain
    decoding's, the draft's tokens verified under the tool grammar."""
    import httpx

    bodies = [{"tool_choice": "required", "parallel_tool_calls": False},
              {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
              {"guided_regex": CALL.replace("{", "\\{").replace("}", "\\}"), "max_tokens": 100}]
    flags = ("--chat-template", "chatml-tools", "--enable-auto-tool-choice", "--tool-call-parser", "qwen25",
             "--max-seq-len", "512")  # SGLang's name for hermes

    def replies(*args) -> list[dict]:
        with serve(*args, *flags) as (base, _):
            out = [httpx.post(f"{base}/v1/chat/completions", timeout=120, json={
                "messages": MESSAGES, "max_tokens": 60, "temperature": 0, "tools": TOOLS, **b}).json() for b in bodies]
        return [(calls_of(r["choices"][0]["message"]), r["choices"][0]["message"]["content"],
                 r["choices"][0]["finish_reason"], r["usage"]["speculative"]["verify_steps"]) for r in out]

    spec = replies("--draft", str(tiny_draft), "--num-steps", "3", "--topk", "2", "--num-draft-tokens", "5")
    plain = replies("--model", str(tiny_target), "--no-speculation")
    assert [s[:3] for s in spec] == [p[:3] for p in plain]
    assert [s[2] for s in spec] == ["tool_calls", "stop", "tool_calls"] and all(s[0] for s in spec)
    assert all(s[3] >= 1 for s in spec)


def test_llama3_python_tag_reaches_the_parser(shared, tmp_path):
    """Llama 3.1's tokenizer: Llama 3's with id 128010 named <|python_tag|>, a special token."""
    from transformers import PreTrainedTokenizerFast

    from toolkit.serve.text import TextStream, shown_ids
    from toolkit.serve.tool_calls import TAGS, ToolCallReader

    text = (shared / "tokenizers" / "llama3" / "tokenizer.json").read_text()
    (tmp_path / "tokenizer.json").write_text(text.replace("<|reserved_special_token_5|>", "<|python_tag|>"))
    tok = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    assert tok.convert_tokens_to_ids("<|python_tag|>") == 128010
    ids = [128010] + tok('{"name": "f", "parameters": {"x": 1}}', add_special_tokens=False).input_ids + [128009]
    assert TextStream(tok, []).update(ids, True) == '{"name": "f", "parameters": {"x": 1}}'  # the tag dropped
    text = TextStream(tok, [], keep=shown_ids(tok, TAGS["llama3_json"])).update(ids, True)
    assert text == '<|python_tag|>{"name": "f", "parameters": {"x": 1}}'  # kept, <|eot_id|> still dropped
    content, [call] = ToolCallReader("llama3_json").feed(text, done=True)
    assert content == "" and call["function"] == {"name": "f", "arguments": '{"x": 1}'}
