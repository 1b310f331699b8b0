"""vLLM's /tokenize, /detokenize and /tokenizer_info: the ids are the ones the completion endpoints feed the engine
(a chat's count is its usage.prompt_tokens), ids decode back, and the two checks lm-evaluation-harness makes before
tokenizing through the server (its "remote" backend) pass; bad bodies get a 400 naming the field."""
import pytest
from fastapi.testclient import TestClient

from toolkit.data.tokenizer import load_tokenizer

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name three colors."}]


@pytest.fixture(scope="module")
def client(tiny_target, in_process_app):
    with in_process_app(tiny_target) as (asgi, _), TestClient(asgi) as c:
        yield c


@pytest.fixture(scope="module")
def tok(tiny_target):
    return load_tokenizer(model=str(tiny_target))


def test_a_prompt_and_a_chat_tokenize_to_the_ids_the_engine_gets(client, tok):
    r = client.post("/tokenize", json={"prompt": "The capital of France", "return_token_strs": True}).json()
    ids = tok("The capital of France").input_ids
    assert r["tokens"] == ids and r["count"] == len(ids) and r["max_model_len"] == 128
    assert r["token_strs"] == tok.convert_ids_to_tokens(ids)
    assert client.post("/tokenize", json={"prompt": "x", "add_special_tokens": False}).json()["token_strs"] is None
    chat = client.post("/tokenize", json={"messages": MESSAGES}).json()
    reply = client.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 1}).json()
    assert chat["count"] == reply["usage"]["prompt_tokens"]
    assert tok.decode(chat["tokens"]).endswith("<|im_start|>assistant\n")
    bare = client.post("/tokenize", json={"messages": MESSAGES, "add_generation_prompt": False}).json()
    assert chat["tokens"][:bare["count"]] == bare["tokens"] and bare["count"] < chat["count"]


def test_ids_detokenize_back(client, tok):
    ids = tok("snow \u2603 man").input_ids
    assert client.post("/detokenize", json={"tokens": ids}).json() == {"prompt": tok.decode(ids)}


def test_lm_eval_finds_the_remote_tokenizer(client, tok):
    """lm_eval.utils.check_remote_tokenizer_support: /tokenizer_info has eos_token, /tokenize answers a list."""
    info = client.get("/tokenizer_info").json()
    assert info["eos_token"] == tok.eos_token and info["chat_template"] == tok.chat_template
    assert info["model_max_length"] == 128 and isinstance(info["vocab_size"], int)
    r = client.post("/tokenize", json={"prompt": "test", "add_special_tokens": False}).json()
    assert r["tokens"] == tok("test", add_special_tokens=False).input_ids


@pytest.mark.parametrize("path, body, status, param", [
    ("/tokenize", {}, 400, "prompt"),
    ("/tokenize", {"prompt": "a", "messages": MESSAGES}, 400, "prompt"),
    ("/tokenize", {"messages": [{"role": "robot", "content": "x"}]}, 400, "messages.0.role"),
    ("/tokenize", {"prompt": "a", "chat_template_kwargs": {"tokenize": True}}, 400, "chat_template_kwargs"),
    ("/tokenize", {"prompt": "a", "model": "other"}, 404, "model"),
    ("/tokenize", {"messages": MESSAGES, "tools": [{"type": "function"}]}, 400, "tools[0]"),  # no function in it
    ("/tokenize", {"prompt": "Hi", "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools"),
    ("/tokenize", {"messages": MESSAGES, "chat_template": "{{ 1 }}"}, 400, "chat_template"),
    ("/detokenize", {"tokens": [1, 10 ** 9]}, 400, "tokens"),
    ("/detokenize", {"tokens": ["a"]}, 400, "tokens.0"),
    ("/detokenize", {}, 400, "tokens"),
])
def test_bad_bodies_are_refused_by_name(client, path, body, status, param):
    r = client.post(path, json=body)
    assert r.status_code == status and r.json()["error"]["param"] == param, r.text


def test_a_final_assistant_message_is_continued(client, tok):
    """vLLM's continue_final_message (with add_generation_prompt false): the template leaves the assistant's
    message open, /tokenize and the chat endpoint agree on its ids, and the reply goes on from its last word."""
    body = {"messages": MESSAGES + [{"role": "assistant", "content": "Red, green and"}],
            "add_generation_prompt": False, "continue_final_message": True}
    ids = client.post("/tokenize", json=body).json()["tokens"]
    assert tok.decode(ids).endswith("<|im_start|>assistant\nRed, green and")
    r = client.post("/v1/chat/completions", json={**body, "max_tokens": 6, "temperature": 0}).json()
    plain = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 6, "temperature": 0}).json()
    assert r["choices"][0]["message"]["content"] == plain["choices"][0]["text"] != ""
    assert r["usage"]["prompt_tokens"] == len(ids)
    r = client.post("/v1/chat/completions", json={**body, "continue_final_message": False})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"


def test_ping_and_version(client):
    from toolkit import __version__

    assert client.get("/version").json() == {"version": __version__}
    for method in ("GET", "POST"):
        r = client.request(method, "/ping")
        assert r.status_code == 200 and r.json()["status"] == "ok"
