"""--reasoning-parser: a chat reply's thinking goes to reasoning_content (and vLLM's newer `reasoning`), the
answer to content, whole or streamed (the deltas join to the whole split whatever the pieces, a tag split across
them included); qwen3 thinks only when the reply opens with <think>, deepseek_r1 until </think>; gpt_oss reads
harmony's channels (analysis: thinking; final, commentary: the answer), its special-token headers kept in the text
it reads and out of the client's."""
import json

import pytest
from fastapi.testclient import TestClient

from toolkit.serve.reasoning import ReasoningSplit, reasoning_split

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


HARMONY = {  # gpt-oss's reply after its generation prompt `<|start|>assistant` -> (reasoning, content)
    "<|channel|>analysis<|message|>User asks 2+2.<|end|><|start|>assistant<|channel|>final<|message|>4.":
        ("User asks 2+2.", "4."),
    "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis<|message|>b<|end|>"
    "<|start|>assistant<|channel|>final<|message|>c <|d|>": ("a\nb", "c <|d|>"),  # two messages: a line apart
    "<|channel|>analysis<|message|>cut off by max_tokens": ("cut off by max_tokens", ""),
    "<|channel|>analysis<|message|>done<|end|><|start|>assistant<|chan": ("done", ""),  # a header cut off
    "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"x\": 1}": ("", '{"x": 1}'),
    "<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{}": ("", "{}"),
    "No header at all, <|end|> or not.": ("", "No header at all,  or not."),  # a stray end tag dropped
    "<": ("", "<"),  # a reply that only looked like a header's start
    "": ("", ""),
}


@pytest.mark.parametrize("reply", list(HARMONY))
def test_harmony_replies_split_whole_and_streamed_alike(reply):
    assert reasoning_split("gpt_oss").feed(reply, done=True) == HARMONY[reply]
    for size in (1, 2, 3, 7):
        split, got = reasoning_split("gpt_oss"), ["", ""]
        for i in range(0, len(reply), size):
            for k, part in enumerate(split.feed(reply[i:i + size])):
                got[k] += part
        for k, part in enumerate(split.feed("", done=True)):
            got[k] += part
        assert tuple(got) == HARMONY[reply], size


def test_harmony_headers_are_kept_for_the_parser_and_out_of_the_client_text():
    """TextStream with the parser's tags kept (the served chat's `keep`) gives the parser the headers, which are
    special tokens; the client's stop-string text leaves them out. And <|end|> is no end of turn in harmony."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from toolkit.infer.loading import stop_ids
    from toolkit.serve.reasoning import TAGS
    from toolkit.serve.text import TextStream, shown_ids

    specials = ["<|endoftext|>", "<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>",
                "<|constrain|>"]
    words = ["assistant", "analysis", "final", "two", "plus", "four"]
    inner = Tokenizer(models.WordLevel({w: i for i, w in enumerate(specials + words)}, unk_token="<|endoftext|>"))
    inner.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=inner, eos_token="<|return|>")
    tok.add_special_tokens({"additional_special_tokens": specials})
    ids = tok("<|channel|> analysis <|message|> two plus two <|end|> <|start|> assistant <|channel|> final "
              "<|message|> four").input_ids
    stream = TextStream(tok, [], keep=shown_ids(tok, TAGS["gpt_oss"]))
    thought, answer = reasoning_split("gpt_oss").feed(stream.scan(ids, done=True), done=True)
    assert (thought.split(), answer.split()) == (["two", "plus", "two"], ["four"])
    assert "<|" not in TextStream(tok, []).scan(ids, done=True)
    # bench's multi-turn history and in-process regeneration take the final channel's text, not the run-on
    # "analysis two plus two assistant final four" a decode without the tags gives
    from toolkit.data.harmony import reply_text

    assert reply_text(tok, ids).split() == ["four"]
    assert tok.decode(ids, skip_special_tokens=True).split() == ["analysis", "two", "plus", "two", "assistant",
                                                                 "final", "four"]
    assert stop_ids(tok) == {tok.convert_tokens_to_ids("<|return|>"), tok.convert_tokens_to_ids("<|call|>")}


def test_an_unknown_parser_is_refused():
    with pytest.raises(ValueError, match="accepted qwen3, deepseek_r1, gpt_oss"):
        ReasoningSplit("granite")


@pytest.mark.parametrize("parser", ["qwen3", "deepseek_r1", "gpt_oss"])
def test_served_replies_are_split(tiny_target, in_process_app, parser):
    """The random target never writes a tag: deepseek_r1 reads its whole reply as thinking (cut by max_tokens),
    qwen3 and gpt_oss (no harmony header) as the answer; streamed deltas join to the same parts."""
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


def test_a_reply_constrained_from_its_first_token_is_content_not_thinking(tiny_target, in_process_app):
    """deepseek_r1 reads a reply as thinking until `</think>`; one the grammar holds from its first token (here no
    `</think>` token exists to wait for) never writes it: the choice came back as reasoning and content empty
    (a named tool's arguments likewise, its call empty). It is the content, whole and streamed."""
    body = {"messages": MESSAGES, "max_tokens": 10, "temperature": 0, "guided_choice": ["red", "blue"]}
    with in_process_app(tiny_target, reasoning_parser="deepseek_r1") as (asgi, _), TestClient(asgi) as client:
        msg = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
        with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
            deltas = [c["delta"] for line in r.iter_lines() if line.startswith("data: {")
                      for c in json.loads(line[6:])["choices"]]
    assert msg["content"] in ("red", "blue") and msg["reasoning_content"] is None
    assert "".join(d.get("content") or "" for d in deltas) == msg["content"]
    assert not any(d.get("reasoning_content") for d in deltas)


def test_a_prompt_that_closed_its_think_block_gets_a_reply_of_content():
    """Qwen3 with enable_thinking false ends its prompt with an empty think block: the reply is all content for
    every parser (deepseek_r1 read it all as thinking); a prompt that opened the block (R1's) is thinking first."""
    from types import SimpleNamespace

    from toolkit.serve.reasoning import reply_closed

    class Tok:
        unk_token_id = 0
        ids = {"<think>": 5, "</think>": 6}

        def convert_tokens_to_ids(self, t):
            return self.ids.get(t, 0)

        def convert_ids_to_tokens(self, i):
            return {v: k for k, v in self.ids.items()}.get(i, "<unk>")

        def decode(self, ids):
            return "".join({5: "<think>", 6: "</think>", 3: "\n\n"}.get(i, "x") for i in ids)

    closed, opened = [1, 2, 5, 9, 6, 3], [1, 2, 6, 3, 5]
    assert reply_closed(Tok(), SimpleNamespace(prompt=closed, grammar=None))
    assert not reply_closed(Tok(), SimpleNamespace(prompt=opened, grammar=None))
    # Qwen3 keeps the think block of an assistant turn after the last user query (a tool loop): it is followed by
    # that turn's call, the tool turn and the next header, and the new reply thinks again (it was read as content)
    tool_loop = [1, 2, 5, 9, 6, 3, 7, 8, 1, 2]
    assert not reply_closed(Tok(), SimpleNamespace(prompt=tool_loop, grammar=None))
    split = reasoning_split("deepseek_r1", closed=True)
    assert split.feed("The answer.", done=True) == ("", "The answer.")
    # usage's reasoning_tokens (Responses' output_tokens_details, chat's completion_tokens_details; was always 0):
    # the tokens inside the block, tags left out, as vLLM counts them
    from toolkit.serve.reasoning import reasoning_tokens

    assert reasoning_tokens(Tok(), "deepseek_r1", [7, 8, 9, 6, 10, 11], closed=False) == 3
    assert reasoning_tokens(Tok(), "deepseek_r1", [5, 7, 8, 6, 10], closed=False) == 2  # a leading <think> too
    assert reasoning_tokens(Tok(), "deepseek_r1", [7, 8, 9], closed=False) == 3  # cut inside its thinking
    assert reasoning_tokens(Tok(), "deepseek_r1", [7, 8, 9], closed=True) == 0
    assert reasoning_tokens(Tok(), "qwen3", [5, 7, 8, 6, 10], closed=False) == 2
    assert reasoning_tokens(Tok(), "qwen3", [7, 8, 6, 10], closed=False) == 0  # no block opened: all answer


def test_structured_output_beside_the_gpt_oss_parser_is_refused(tiny_target, in_process_app):
    """Harmony's answer starts after its analysis message and a header: a grammar from the first token would
    break the format, so a constrained chat request is refused by name, not served wrong."""
    body = {"messages": MESSAGES, "max_tokens": 4, "response_format": {"type": "json_object"}}
    with in_process_app(tiny_target, stops=(), reasoning_parser="gpt_oss") as (asgi, _), TestClient(asgi) as client:
        r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and "--reasoning-parser gpt_oss" in r.json()["error"]["message"]


@pytest.mark.parametrize("name", ["gpt_oss", "gpt-oss", "openai_gptoss"])
def test_sglang_and_vllm_names_of_the_harmony_parser_are_read(name):
    from toolkit.cli import build_parser
    from toolkit.serve.engine_args import check

    args = build_parser().parse_args(["serve", "--draft", "nowhere", "--reasoning-parser", name])
    check(args, "serve")
    assert args.reasoning_parser == "gpt_oss"


def test_responses_usage_carries_the_reasoning_tokens_chat_counted():
    from toolkit.serve.response_items import response_usage

    chat = {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14, "prompt_tokens_details": {
        "cached_tokens": 2}, "completion_tokens_details": {"reasoning_tokens": 7}, "speculative": {}}
    assert response_usage(chat)["output_tokens_details"] == {"reasoning_tokens": 7}
    del chat["completion_tokens_details"]  # no reasoning parser: none counted
    assert response_usage(chat)["output_tokens_details"] == {"reasoning_tokens": 0}
