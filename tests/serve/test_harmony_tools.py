"""`--tool-call-parser openai` (vLLM's name; SGLang's gpt-oss) beside `--reasoning-parser gpt_oss`: a harmony
message addressed `to=functions.NAME` (the recipient before or after the channel) is a tool call whose body is the
arguments; the analysis stays reasoning, other commentary and final text content; a call to a built-in tool
(browser, python) is content, as nothing the model wrote is lost. Whole and streamed readings agree, through the
same Choice a served chat reads its replies with (finish_reason tool_calls)."""
import json
from types import SimpleNamespace

import pytest

from toolkit.serve.app import Served
from toolkit.serve.choice import Choice

GET = '{"city": "Paris"}'
# reply after `<|start|>assistant` (its stop token <|call|> not in the text) -> (reasoning, content, calls); served,
# a reply holds one call at most (<|call|> ends it), but the reading takes any number
CASES = {
    "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
    f"to=functions.get_weather <|constrain|>json<|message|>{GET}":
        ("Need the weather.", None, [("get_weather", GET)]),
    f" to=functions.get_weather<|channel|>commentary json<|message|>{GET}": (None, None, [("get_weather", GET)]),
    "<|channel|>commentary<|message|>Checking two things.<|end|><|start|>assistant to=functions.get_time"
    f'<|channel|>commentary json<|message|>{{"zone": "CET"}}<|call|><|start|>assistant to=functions.get_weather'
    f"<|channel|>commentary json<|message|>{GET}":
        (None, "Checking two things.", [("get_time", '{"zone": "CET"}'), ("get_weather", GET)]),
    '<|channel|>analysis<|message|>Search.<|end|><|start|>assistant<|channel|>commentary to=browser.search '
    '<|constrain|>json<|message|>{"query": "x"}': ("Search.", '{"query": "x"}', []),
    "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>It is 4.":
        ("Easy.", "It is 4.", []),
    "to be or not": (None, "to be or not", []),
    "to": (None, "to", []),
    "to=x": (None, "to=x", []),  # no header after all: plain text
    # a commentary preamble, then the answer: two messages of the content, a line apart (vLLM's join)
    "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>final<|message|>It is 4.":
        (None, "Checking.\nIt is 4.", []),
    # arguments re-written compactly, as the other parsers write theirs
    ' to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{ "city" :"Paris" }':
        (None, None, [("get_weather", GET)]),
    # cut by max_tokens: the call as far as it was written (OpenAI's truncated arguments, finish_reason length)
    '<|channel|>commentary to=functions.get_weather<|message|>{"city": ': (None, None, [("get_weather", '{"city":')]),
}


def choice(tok, parallel: bool = True) -> Choice:
    """A chat choice as the server builds it for tool_choice auto, reading text it is handed (no engine)."""
    req = SimpleNamespace(seq=SimpleNamespace(params=SimpleNamespace(min_tokens=0, logprobs=None)))
    return Choice(0, req, None, tok, [], True, reasoning="gpt_oss", tools=("openai", None, parallel))


def merged(c: Choice, pieces: list[str]) -> dict:
    """A streamed reply's deltas joined as OpenAI clients join them (calls merged by index)."""
    out, calls = {"reasoning_content": "", "content": ""}, {}
    for i, piece in enumerate([*pieces, ""]):
        body = c.body(piece, "stop" if i == len(pieces) else None, delta=True)
        d = body["delta"]
        out["reasoning_content"] += d.get("reasoning_content", "")
        out["content"] += d.get("content", "")
        for t in d.get("tool_calls", []):
            calls.setdefault(t["index"], t)  # a harmony call goes out whole, once
    return {"reasoning_content": out["reasoning_content"] or None, "content": out["content"] or None,
            "calls": [(t["function"]["name"], t["function"]["arguments"]) for _, t in sorted(calls.items())],
            "finish_reason": body["finish_reason"]}


@pytest.mark.parametrize("reply", list(CASES), ids=lambda r: r[:40])
def test_harmony_calls_whole_and_streamed(qwen2_tokenizer, reply):
    thought, content, calls = CASES[reply]
    whole = choice(qwen2_tokenizer).body(reply, "stop", delta=False)
    msg = whole["message"]
    assert (msg["reasoning_content"], msg["content"]) == (thought, content)
    assert [(t["function"]["name"], t["function"]["arguments"]) for t in msg.get("tool_calls", [])] == calls
    assert all(t["id"].startswith("chatcmpl-tool-") and t["type"] == "function" for t in msg.get("tool_calls", []))
    assert whole["finish_reason"] == ("tool_calls" if calls else "stop")
    for size in (1, 2, 3, 7):  # any chunking: a header or a recipient may arrive in pieces
        got = merged(choice(qwen2_tokenizer), [reply[i:i + size] for i in range(0, len(reply), size)])
        assert got == {"reasoning_content": thought, "content": content, "calls": calls,
                       "finish_reason": whole["finish_reason"]}, size


def test_without_parallel_calls_the_first_is_kept(qwen2_tokenizer):
    reply = next(r for r in CASES if len(CASES[r][2]) == 2)
    msg = choice(qwen2_tokenizer, parallel=False).body(reply, "stop", delta=False)["message"]
    assert [t["function"]["name"] for t in msg["tool_calls"]] == ["get_time"]
    assert json.loads(msg["tool_calls"][0]["function"]["arguments"]) == {"zone": "CET"}


def test_the_openai_parser_needs_the_gpt_oss_split(qwen2_tokenizer):
    with pytest.raises(ValueError, match="tool parser openai .* needs reasoning parser gpt_oss"):
        Served("m", qwen2_tokenizer, frozenset(), None, reasoning_parser="qwen3", tool_parser="openai")
    assert Served("m", qwen2_tokenizer, frozenset(), None, reasoning_parser="gpt_oss", tool_parser="openai")


def test_an_assistant_turns_reasoning_reaches_the_template_by_both_names():
    """History sent back with an assistant turn's reasoning (chat's reasoning_content or vLLM's reasoning, a
    Responses reasoning item, an Anthropic thinking block) reaches the template as Qwen3's reasoning_content and
    gpt-oss's thinking: gpt-oss's keeps the analysis before a tool call that no answer follows yet, as vLLM's
    harmony prompt does, and Qwen3's the thinking of the turns after the last user turn."""
    from toolkit.serve.anthropic import chat_messages
    from toolkit.serve.messages import Message
    from toolkit.serve.responses import input_messages
    from toolkit.serve.tools import template_turn

    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": GET}}
    turn = template_turn(Message(role="assistant", content=None, reasoning="Need the weather.", tool_calls=[call]))
    assert turn["thinking"] == turn["reasoning_content"] == "Need the weather."
    assert turn["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert {"thinking", "reasoning_content"}.isdisjoint(template_turn(Message(role="assistant", content="Hi.")))
    with pytest.raises(ValueError, match="a user message has no reasoning"):
        Message(role="user", content="x", reasoning_content="y")
    items = [{"role": "user", "content": "Weather in Paris?"},
             {"type": "reasoning", "id": "rs_1", "summary": [],
              "content": [{"type": "reasoning_text", "text": "Need the weather."}]},
             {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": GET},
             {"type": "function_call_output", "call_id": "c1", "output": "sunny"}]
    msgs = input_messages(items)
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool"]
    assert msgs[1]["reasoning_content"] == "Need the weather." and "reasoning_content" not in msgs[2]
    blocks = [{"type": "thinking", "thinking": "Need the weather.", "signature": ""},
              {"type": "tool_use", "id": "c1", "name": "get_weather", "input": {"city": "Paris"}}]
    anthropic = chat_messages([{"role": "user", "content": "Weather in Paris?"},
                               {"role": "assistant", "content": blocks}])
    assert anthropic[1]["reasoning_content"] == "Need the weather." and anthropic[1]["tool_calls"]
