"""Tool calls read out of a reply (toolkit/serve/tool_calls.py, tool_formats.py): hermes blocks, llama3_json
objects, pythonic lists, mistral's [TOOL_CALLS] (both forms), required's array and a named function's arguments;
whatever is not a call stays content; the streamed deltas of any chunking join to the whole reading;
parallel_tool_calls false keeps the first call."""
import json

import pytest

from toolkit.serve.tool_calls import ToolCallReader

W = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
T = '{"name": "get_time", "arguments": {"zone": "CET"}}'
WEATHER, TIME = ("get_weather", {"city": "Paris"}), ("get_time", {"zone": "CET"})
CASES = {  # (mode, reply) -> (content, [(name, arguments)])
    ("hermes", "It is sunny."): ("It is sunny.", []),
    ("hermes", f"<tool_call>\n{W}\n</tool_call>"): ("", [WEATHER]),
    ("hermes", f"Let me check.\n<tool_call>\n{W}\n</tool_call>\n<tool_call>{T}</tool_call>\n"):
        ("Let me check.\n", [WEATHER, TIME]),
    ("hermes", f"<tool_call>{W}</tool_call>\nDone."): ("\nDone.", [WEATHER]),
    ("hermes", f"<tool_call>\n{W}"): ("", [WEATHER]),  # cut by max_tokens after a whole object
    ("hermes", '<tool_call>\n{"name": "get_wea'): ('<tool_call>\n{"name": "get_wea', []),  # cut mid-call
    ("hermes", "<tool_call>not json</tool_call> ok"): ("<tool_call>not json</tool_call> ok", []),
    ("hermes", "a <tool_ca"): ("a <tool_ca", []),
    ("hermes", '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>'): ("", [("f", {"x": 1})]),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris"}}'): ("", [WEATHER]),
    ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
                    '{"name": "get_time", "parameters": {"zone": "CET"}}'): ("", [WEATHER, TIME]),
    ("llama3_json", "  The weather is fine."): ("  The weather is fine.", []),
    ("llama3_json", '{"answer": 42}'): ('{"answer": 42}', []),
    ("llama3_json", '{"name": "get_weather", "parameters": {"ci'): ('{"name": "get_weather", "parameters": {"ci', []),
    ("llama3_json", "<|python"): ("<|python", []),
    ("pythonic", '[get_weather(city="Paris"), get_time(zone="CET")]'): ("", [WEATHER, TIME]),
    ("pythonic", '<|python_start|>[get_weather(city="Paris")]<|python_end|>'): ("", [WEATHER]),
    ("pythonic", "[f(xs=[1, 2], on=True, k=None)]"): ("", [("f", {"xs": [1, 2], "on": True, "k": None})]),
    ("pythonic", "[1, 2, 3] are numbers"): ("[1, 2, 3] are numbers", []),
    ("pythonic", "[f(x=os.environ)]"): ("[f(x=os.environ)]", []),  # not a literal: no call
    ("pythonic", "It is sunny [really]."): ("It is sunny [really].", []),
    ("mistral", f'[TOOL_CALLS] [{W}, {T}]'): ("", [WEATHER, TIME]),
    ("mistral", 'Let me look.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"zone": "CET"}'):
        ("Let me look.", [WEATHER, TIME]),
    ("mistral", "No tools needed [TOOL"): ("No tools needed [TOOL", []),
    ("mistral", "[TOOL_CALLS] [{\"name\": \"get_wea"): ("[TOOL_CALLS] [{\"name\": \"get_wea", []),
    ("required", '[{"name": "get_weather", "parameters": {"city": "Paris"}}, '
                 '{"name": "get_time", "parameters": {"zone": "CET"}}]'): ("", [WEATHER, TIME]),
    ("required", '[{"name": "get_weather", "parameters": {"ci'): ('[{"name": "get_weather", "parameters": {"ci', []),
    ("required", "[]"): ("[]", []),
}


def read(reader: ToolCallReader, pieces: list[str]) -> tuple[str, list]:
    """Feed the pieces, then the end; join content and merge call deltas by index (as OpenAI clients do)."""
    content, calls = "", {}
    for i, piece in enumerate([*pieces, None]):
        text, deltas = reader.feed(piece or "", done=piece is None)
        content += text
        for d in deltas:
            call = calls.setdefault(d["index"], {"id": d.get("id"), "name": "", "arguments": ""})
            assert "id" not in d or call["id"] == d["id"]  # the id comes once, with the first delta
            call["name"] += d["function"].get("name", "")
            call["arguments"] += d["function"]["arguments"]
    assert all(c["id"].startswith("chatcmpl-tool-") for c in calls.values())
    return content, [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())]


@pytest.mark.parametrize("case", list(CASES), ids=lambda c: f"{c[0]}:{c[1][:24]}")
def test_whole_and_streamed_readings_agree(case):
    mode, reply = case
    want = CASES[case]
    assert read(ToolCallReader(mode), [reply]) == want
    for size in (1, 2, 3, 7):  # any chunking: a tag or an object may arrive in pieces
        assert read(ToolCallReader(mode), [reply[i:i + size] for i in range(0, len(reply), size)]) == want, size


def test_content_streams_before_a_call_and_a_call_goes_out_whole_once_closed():
    reader = ToolCallReader("hermes")
    assert reader.feed("Checking ") == ("Checking ", [])
    assert reader.feed("now <tool") == ("now ", [])  # "<tool" may open a call: held
    assert reader.feed(f"_call>{W[:20]}") == ("", [])
    content, calls = reader.feed(f"{W[20:]}</tool_call>")
    assert content == "" and [(c["function"]["name"], c["index"]) for c in calls] == [("get_weather", 0)]


def test_a_named_function_streams_its_arguments_as_written():
    reader = ToolCallReader("named", "get_weather")
    first = reader.feed('{"ci')
    assert first[0] == "" and first[1][0]["function"] == {"name": "get_weather", "arguments": '{"ci'}
    assert reader.feed('ty": "Paris"}') == ("", [{"index": 0, "function": {"arguments": 'ty": "Paris"}'}}])
    assert reader.feed("", done=True) == ("", [])
    assert read(ToolCallReader("named", "f"), ['{"x": 1}']) == ("", [("f", {"x": 1})])


@pytest.mark.parametrize("mode, reply", [("hermes", f"<tool_call>{W}</tool_call><tool_call>{T}</tool_call>"),
                                         ("llama3_json", f"{W}; {T}"),
                                         ("pythonic", '[get_weather(city="Paris"), get_time(zone="CET")]'),
                                         ("mistral", f"[TOOL_CALLS][{W}, {T}]"),
                                         ("required", json.dumps([{"name": n, "parameters": a}
                                                                  for n, a in (WEATHER, TIME)]))])
def test_without_parallel_calls_the_first_is_kept(mode, reply):
    assert read(ToolCallReader(mode, parallel=False), [reply]) == ("", [WEATHER])


def test_an_unknown_parser_is_refused():
    with pytest.raises(ValueError, match="accepted hermes, llama3_json, pythonic, mistral"):
        ToolCallReader("granite")
