"""--reasoning-parser: a chat reply's thinking goes to reasoning_content (and vLLM's newer `reasoning`), the
answer to content, whole or streamed (the deltas join to the whole split whatever the pieces, a tag split across
them included); qwen3 thinks only when the reply opens with <think>, deepseek_r1 until </think>."""
import json

import pytest
from fastapi.testclient import TestClient

from toolkit.serve.reasoning import ReasoningSplit

MESSAGES = [{"role": "user", "content": "Name three colors."}]
CASES = {  # reply -> (qwen3, deepseek_r1) as (reasoning, content)
    "<think>\nthe user asks\n</think>\n\nRed.": (("\nthe user asks\n", "\n\nRed."), ("\nthe user asks\n", "\n\nRed.")),
    "Red, green, blue.": (("", "Red, green, blue."), ("Red, green, blue.", "")),
    "planning</think>Red.": (("", "planning</think>Red."), ("planning", "Red.")),
    "<think>cut off by max_tokens": (("cut off by max_tokens", ""), ("cut off by max_tokens", "")),
    "\n<think>a</think>b</think>c": (("a", "b</think>c"), ("a", "b</think>c")),
    "<thin": (("", "<thin"), ("<thin", "")),
    "": (("", ""), ("", "")),
}


@pytest.mark.parametrize("parser", ["qwen3", "deepseek_r1"])
@pytest.mark.parametrize("reply", list(CASES))
def test_whole_and_streamed_splits_agree(parser, reply):
    want = CASES[reply][parser == "deepseek_r1"]
    assert ReasoningSplit(parser).feed(reply, done=True) == want
    for size in (1, 2, 3, 5):  # any chunking: a tag may arrive in pieces
        split, got = ReasoningSplit(parser), ["", ""]
        for i in range(0, len(reply), size):
            for k, part in enumerate(split.feed(reply[i:i + size])):
                got[k] += part
        for k, part in enumerate(split.feed("", done=True)):
            got[k] += part
        assert tuple(got) == want, size


def test_an_unknown_parser_is_refused():
    with pytest.raises(ValueError, match="accepted qwen3, deepseek_r1"):
        ReasoningSplit("granite")


@pytest.mark.parametrize("parser", ["qwen3", "deepseek_r1"])
def test_served_replies_are_split(tiny_target, in_process_app, parser):
    """The random target never writes a tag: deepseek_r1 reads its whole reply as thinking (cut by max_tokens),
    qwen3 as the answer; streamed deltas join to the same parts."""
    body = {"messages": MESSAGES, "max_tokens": 10, "temperature": 0}
    with in_process_app(tiny_target, stops=()) as (asgi, _), TestClient(asgi) as plain:
        text = plain.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]
    with in_process_app(tiny_target, stops=(), reasoning_parser=parser) as (asgi, _), TestClient(asgi) as client:
        msg = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
        with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
            deltas = [c["delta"] for line in r.iter_lines() if line.startswith("data: {")
                      for c in json.loads(line[6:])["choices"]]
    thought, answer = (text, None) if parser == "deepseek_r1" else (None, text)
    assert (msg["reasoning_content"], msg["reasoning"], msg["content"]) == (thought, thought, answer)
    assert "".join(d.get("reasoning_content", "") for d in deltas) == (thought or "")
    assert "".join(d.get("content") or "" for d in deltas) == (answer or "")
    assert all(d.get("reasoning") == d.get("reasoning_content") for d in deltas)
