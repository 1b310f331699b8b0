"""SGLang's native /generate: text or input_ids, one prompt or a batch, SGLang's sampling_params names and
defaults, cumulative streaming, output log-probs, finish reasons, and refusals naming the field; answers equal the
completions endpoint's (the same engine sequences)."""
from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient


@pytest.fixture(scope="module")
def client(tiny_target, in_process_app):
    with in_process_app(tiny_target, max_len=256) as (app, engine), TestClient(app) as http:
        yield http


def completion(http, prompt, **extra) -> dict:
    return http.post("/v1/completions", json={"prompt": prompt, "temperature": 0, **extra}).json()


def test_one_text_prompt_answers_one_object_equal_to_completions(client):
    r = client.post("/generate", json={"text": "The sky is", "sampling_params": {"max_new_tokens": 9,
                                                                                 "temperature": 0}})
    assert r.status_code == 200
    out, want = r.json(), completion(client, "The sky is", max_tokens=9)
    assert out["text"] == want["choices"][0]["text"] and len(out["output_ids"]) == 9
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 9} and meta["completion_tokens"] == 9
    assert meta["prompt_tokens"] == want["usage"]["prompt_tokens"] and "spec_verify_ct" not in meta  # no draft
    assert client.post("/tokenize", json={"prompt": "x"}).status_code == 200  # the app's other routes stand


def test_input_ids_batches_and_n_answer_lists_prompt_major(client):
    ids = [[1, 504, 3134, 314], [1, 504, 2356]]
    r = client.post("/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 4, "temperature": 0,
                                                                             "n": 2}}).json()
    assert isinstance(r, list) and len(r) == 4
    want = completion(client, ids, max_tokens=4, n=2)
    assert [o["text"] for o in r] == [c["text"] for c in want["choices"]]
    assert r[0]["output_ids"] == r[1]["output_ids"] and r[0]["meta_info"]["prompt_tokens"] == 4
    one = client.post("/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 2, "n": 2}}).json()
    assert isinstance(one, list) and len(one) == 2  # n > 1: a list, as SGLang


def test_sglang_defaults_and_names(client):
    out = client.post("/generate", json={"text": "Once upon", "sampling_params": {"temperature": 0, "top_k": -1,
                                                                                  "ignore_eos": True}}).json()
    assert out["meta_info"]["completion_tokens"] == 128  # SGLang's default max_new_tokens
    stop = completion(client, "Once upon", max_tokens=12)["choices"][0]["text"].split()[1]
    out = client.post("/generate", json={"text": "Once upon", "sampling_params": {
        "temperature": 0, "max_new_tokens": 12, "stop": [stop]}}).json()
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop} and stop not in out["text"]
    first = out["output_ids"][0] if out["output_ids"] else None
    if first is not None:
        by_id = client.post("/generate", json={"text": "Once upon", "sampling_params": {
            "temperature": 0, "max_new_tokens": 12, "stop_token_ids": [first]}}).json()
        assert by_id["meta_info"]["finish_reason"] == {"type": "stop", "matched": first}
    seeded = [client.post("/generate", json={"text": "Pick", "sampling_params": {
        "temperature": 1.0, "max_new_tokens": 6, "sampling_seed": 7}}).json()["output_ids"] for _ in range(2)]
    assert seeded[0] == seeded[1]


def test_regex_and_json_schema_constrain_as_on_completions(client):
    out = client.post("/generate", json={"text": "Color:", "sampling_params": {
        "temperature": 0, "max_new_tokens": 8, "regex": "(red|green|blue)"}}).json()
    assert out["text"] in ("red", "green", "blue") and out["meta_info"]["finish_reason"]["type"] == "stop"
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    out = client.post("/generate", json={"text": "JSON:", "sampling_params": {
        "temperature": 0, "max_new_tokens": 30, "json_schema": json.dumps(schema)}}).json()
    assert out["text"] == completion(client, "JSON:", max_tokens=30, guided_json=schema)["choices"][0]["text"]
    assert out["text"] != completion(client, "JSON:", max_tokens=30)["choices"][0]["text"]


def test_output_logprobs_in_sglang_shape(client):
    out = client.post("/generate", json={"text": "The sky is", "return_logprob": True, "top_logprobs_num": 2,
                                         "return_text_in_logprobs": True,
                                         "sampling_params": {"max_new_tokens": 3, "temperature": 0}}).json()
    want = completion(client, "The sky is", max_tokens=3, logprobs=2)["choices"][0]["logprobs"]
    lps = out["meta_info"]["output_token_logprobs"]
    assert [lp[1] for lp in lps] == out["output_ids"] and [lp[2] for lp in lps] == want["tokens"]
    assert [lp[0] for lp in lps] == pytest.approx(want["token_logprobs"])
    assert all(len(top) == 2 and top[0][1] == tid for top, tid in zip(out["meta_info"]["output_top_logprobs"],
                                                                     out["output_ids"]))  # greedy: top-1 chosen


def test_prompt_logprobs_from_logprob_start_len(client):
    ids = [1, 504, 3134, 314, 2356]
    out = client.post("/generate", json={"input_ids": ids, "return_logprob": True, "logprob_start_len": 2,
                                         "top_logprobs_num": 1, "sampling_params": {"max_new_tokens": 2,
                                                                                    "temperature": 0}}).json()
    want = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 2, "temperature": 0,
                                                "prompt_logprobs": 1}).json()["choices"][0]["prompt_logprobs"]
    got = out["meta_info"]["input_token_logprobs"]
    assert [g[1] for g in got] == ids[2:] and all(g[2] is None for g in got)  # no return_text_in_logprobs
    assert [g[0] for g in got] == pytest.approx([want[i][str(ids[i])]["logprob"] for i in range(2, 5)])
    assert len(out["meta_info"]["input_top_logprobs"]) == 3 and len(out["meta_info"]["input_top_logprobs"][0]) == 1
    full = client.post("/generate", json={"input_ids": ids, "return_logprob": True, "logprob_start_len": 0,
                                          "sampling_params": {"max_new_tokens": 1}}).json()["meta_info"]
    assert full["input_token_logprobs"][0] == [None, 1, None] and len(full["input_token_logprobs"]) == 5


def test_streaming_sends_the_output_so_far_then_done(client):
    body = {"text": "The sky is", "stream": True, "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    with client.stream("POST", "/generate", json=body) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    outs = [json.loads(e) for e in events[:-1]]
    texts = [o["text"] for o in outs]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))  # cumulative, as SGLang streams by default
    whole = client.post("/generate", json={**body, "stream": False}).json()
    assert texts[-1] == whole["text"] and outs[-1]["output_ids"] == whole["output_ids"]
    assert outs[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 8}
    assert all(o["meta_info"]["finish_reason"] is None for o in outs[:-1])


@pytest.mark.parametrize("body, param, text", [
    ({"sampling_params": {}}, "text", "exactly one of text and input_ids"),
    ({"text": "x", "input_ids": [1]}, "text", "exactly one of text and input_ids"),
    ({"text": "x", "sampling_params": {"beam_width": 2}}, "sampling_params", "beam_width not served"),
    ({"text": "x", "sampling_params": {"temperature": -1}}, "temperature", "greater than or equal to 0"),
    ({"text": "x", "sampling_params": {"skip_special_tokens": False}}, "skip_special_tokens", ""),
    ({"text": "x", "sampling_params": {"json_schema": "{oops"}}, "json_schema", ""),
    ({"text": "x", "return_logprob": True, "logprob_start_len": -2}, "logprob_start_len", "give -1"),
    ({"text": "x", "image_data": "a.png"}, "image_data", "Extra inputs are not permitted"),
    ({"input_ids": [1, 10 ** 9]}, "prompt", "prompt token ids must be in"),
])
def test_refusals_name_the_field(client, body, param, text):
    r = client.post("/generate", json=body)
    assert r.status_code == 400, r.json()
    err = r.json()["error"]
    assert err["param"] == param and text in err["message"], err


def test_model_and_server_info_in_sglang_names(client):
    for path in ("/get_model_info", "/model_info"):
        info = client.get(path).json()
        assert info["model_path"] == "tiny" and info["is_generation"] is True
        assert info["model_type"] == "llama"
    for path in ("/get_server_info", "/server_info"):
        info = client.get(path).json()
        assert info["speculative_algorithm"] is None and info["max_running_requests"] == 2
        assert info["context_length"] == 256 and info["disable_radix_cache"] is True
        state = info["internal_states"][0]
        assert state["avg_spec_accept_length"] == pytest.approx(1.0)  # plain decoding: 1 token per step
        assert state["step_time_dict"]["1"] and all(t > 0 for t in state["step_time_dict"]["1"])


def test_flush_cache_empties_the_prefix_cache(tiny_target, in_process_app):
    body = {"messages": [{"role": "user", "content": "A long enough question about the sea and its tides."}],
            "max_tokens": 3, "temperature": 0}
    with in_process_app(tiny_target, max_len=256, prefix_cache_rows=2) as (app, engine), TestClient(app) as http:
        cached = lambda: http.post("/v1/chat/completions", json=body).json()["usage"][  # noqa: E731
            "prompt_tokens_details"]["cached_tokens"]
        assert cached() == 0 and cached() > 0  # the second time the first's KV is reused
        for method in ("POST", "GET"):
            r = http.request(method, "/flush_cache")
            assert r.status_code == 200 and r.text.startswith("Cache flushed")
            assert not engine.prefix_cache.entries and cached() == 0
        assert http.get("/get_server_info").json()["disable_radix_cache"] is False
