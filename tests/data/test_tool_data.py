"""Tool-use conversations as training data (toolkit/data/tools.py): OpenAI's chat schema (tools, tool_calls, role
tool) and ShareGPT's function_call / observation read alike; rendered with the template's own tools block (as
transformers' apply_chat_template renders it); the loss mask covers exactly what the target writes, its calls
as the template writes them and its answers, not the tool definitions or results."""
from __future__ import annotations

import json

import pytest

from toolkit.cli import main
from toolkit.data.chat import ChatRenderer
from toolkit.data.tokenizer import load_tokenizer
from toolkit.data.prepare import tokenize
from toolkit.data.schemas import TOOLS, BadRecord, to_samples

from test_prepare import runs

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
OPENAI = {"messages": [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris and Oslo?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
        {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "18C, sunny"},
    {"role": "tool", "tool_call_id": "c2", "content": {"temp": "4C", "sky": "snow"}},
    {"role": "assistant", "content": "Paris: 18C and sunny. Oslo: 4C with snow."}], "tools": [WEATHER]}
SHAREGPT = {"conversations": [
    {"from": "human", "value": "Weather in Rome?"},
    {"from": "function_call", "value": "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}"},
    {"from": "observation", "value": "25C"},
    {"from": "gpt", "value": "It is 25C in Rome."}], "tools": json.dumps([WEATHER["function"]])}


def test_both_schemas_read_as_the_templates_take_them():
    (conv,) = to_samples(OPENAI)
    assert conv[0][TOOLS] == [WEATHER]
    assert conv[2] == {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}, "id": "c1"},
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}, "id": "c2"}]}
    assert conv[3] == {"role": "tool", "content": "18C, sunny", "tool_call_id": "c1"}
    assert conv[4]["content"] == '{"temp": "4C", "sky": "snow"}'  # a JSON result as the text a template shows
    (conv,) = to_samples(SHAREGPT)
    assert conv[0][TOOLS] == [WEATHER]  # LLaMA-Factory's tools column: JSON text of bare functions
    assert [m["role"] for m in conv] == ["user", "assistant", "tool", "assistant"]
    assert conv[1]["tool_calls"] == [{"type": "function", "function": {"name": "get_weather",
                                                                       "arguments": {"city": "Rome"}}}]


@pytest.mark.parametrize("change, message", [
    ({"tools": "[{bad"}, "tools is JSON text that does not parse"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "a tool should be"),
    ({"tools": {"name": "f"}}, "tools should be a list of objects"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f",
                                                                                     "arguments": "{x"}}]}]},
     "a tool call's arguments is JSON text that does not parse"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}]},
     "arguments should be a JSON object"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}]},
     "a tool call should name its function"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}]},
     "a user message has no tool_calls"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {"x": "\ud800"}}}]}]},
     "tool_calls holds an unpaired surrogate"),
    ({"tools": [{"name": "f\ud800"}]}, "tools holds an unpaired surrogate"),
])
def test_broken_tool_records_say_what_is_wrong(change, message):
    with pytest.raises(BadRecord, match=message):
        to_samples({**OPENAI, **change})


def test_an_empty_tools_list_is_no_tools():
    """`"tools": "[]"` (a column of JSON text) is none: a template that tests `tools is not none` would render its
    tool preamble over an empty list."""
    for empty in ("[]", []):
        (conv,) = to_samples({**OPENAI, "tools": empty, "messages": OPENAI["messages"][:2]})
        assert TOOLS not in conv[0]


@pytest.mark.parametrize("model", ["smollm2", "qwen2"])
def test_the_mask_covers_the_calls_and_answers_the_target_wrote(model, smollm2_dir, shared):
    kind = {"model": str(smollm2_dir)} if model == "smollm2" else {
        "tokenizer": str(shared / "tokenizers/qwen2/tokenizer.json")}
    tok = load_tokenizer(**kind, chat_template="chatml-tools")
    renderer = ChatRenderer(tok)
    for record in (OPENAI, SHAREGPT):
        (conv,) = to_samples(record)
        bare = [{k: v for k, v in m.items() if k != TOOLS} for m in conv]
        want = tok.apply_chat_template(bare, tools=conv[0][TOOLS], tokenize=False)
        rows, counts = tokenize(renderer, [conv], 4096)
        assert counts["bad"] == 0 and len(rows) == 1
        ids, mask = rows[0]["input_ids"], rows[0]["loss_mask"]
        assert tok.decode(ids) == want and '<tools>\n{"type": "function", "function": {"name": "get_weather"' in want
        written = [tok.decode(ids[a:b]) for a, b in runs(mask)]
        calls = "\n".join(f'<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{c}"}}}}\n</tool_call>'
                          for c in (["Paris", "Oslo"] if record is OPENAI else ["Rome"]))
        answer = [m["content"] for m in conv if m["role"] == "assistant"][-1]
        assert written == [calls + "<|im_end|>", answer + "<|im_end|>"]


def test_prepare_data_trains_on_a_tool_corpus(smollm2_dir, tmp_path, capsys):
    src = tmp_path / "tools.jsonl"
    src.write_text(json.dumps(OPENAI) + "\n" + json.dumps(SHAREGPT) + "\n")
    out = tmp_path / "prepared"
    assert main(["prepare-data", "--data", str(src), "--out", str(out), "--chat-template", "chatml-tools"]) == 0
    meta = json.loads((out / "toolkit_prepare.json").read_text())
    assert meta["kept"] == 2 and meta["bad"] == 0


LLAMA31_TOOLS = """{{- bos_token }}
{%- for m in messages %}
{%- if m['role'] == 'assistant' and m.get('tool_calls') %}
{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- for c in m['tool_calls'] %}{{- '{"name": "' + c['function']['name'] + '", "parameters": ' + (c['function']['arguments'] | tojson) + '}' }}{%- endfor %}
{{- '<|eot_id|>' }}
{%- elif m['role'] == 'tool' %}
{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + m['content'] + '<|eot_id|>' }}
{%- else %}
{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] + '<|eot_id|>' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}
"""


def test_a_call_turn_ends_at_its_own_end_of_turn_where_the_next_header_follows_at_once(shared, tmp_path):
    """Llama-3's templates write the next turn's <|start_header_id|> right after a call's <|eot_id|>: the mask took
    it too (a token the target never writes after a call), where ChatML's newline kept them apart."""
    template = tmp_path / "llama31_tools.jinja"
    template.write_text(LLAMA31_TOOLS)
    tok = load_tokenizer(tokenizer=str(shared / "tokenizers/llama3/tokenizer.json"), chat_template=str(template))
    (conv,) = to_samples({**OPENAI, "messages": OPENAI["messages"][1:4] + OPENAI["messages"][5:]})
    rows, _ = tokenize(ChatRenderer(tok), [conv], 4096)
    ids, mask = rows[0]["input_ids"], rows[0]["loss_mask"]
    written = [tok.decode(ids[a:b]) for a, b in runs(mask)]
    assert written == ['{"name": "get_weather", "parameters": {"city": "Paris"}}{"name": "get_weather", '
                       '"parameters": {"city": "Oslo"}}<|eot_id|>', conv[-1]["content"] + "<|eot_id|>"]
