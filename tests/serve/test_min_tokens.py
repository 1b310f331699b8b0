"""vLLM's `min_tokens` m served: the request's stop ids (and the end-of-turn ones, even with ignore_eos) are held
back while fewer than m tokens are out, and a stop string counts only if it ends in the text of a token after the
m-th, in the engine and in the text the client gets: one the first m tokens completed never cuts the text later."""
import json

import pytest
from fastapi.testclient import TestClient

from toolkit.data.tokenizer import load_tokenizer
from toolkit.infer.engine import Engine
from toolkit.infer.loading import load_target
from toolkit.infer.sampling import SamplingParams

PROMPT = "The three primary colors are"


@pytest.fixture(scope="module")
def client(tiny_target, in_process_app):
    with in_process_app(tiny_target, stops=()) as (asgi, _), TestClient(asgi) as c:
        yield c


@pytest.fixture(scope="module")
def ref(tiny_target):
    """(tokenizer, the prompt's ids, a plain engine of the same target): what the server must return."""
    tok = load_tokenizer(model=str(tiny_target))
    return tok, tok(PROMPT).input_ids, Engine(load_target(tiny_target), max_len=128)


def stream_text(client, body: dict) -> str:
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    return "".join(c["text"] for e in events for c in e["choices"])


def test_a_stop_id_ends_the_answer_only_after_min_tokens(client, ref):
    tok, ids, engine = ref
    plain = engine.generate(ids, SamplingParams(max_new_tokens=16)).tokens
    stop = plain[2]  # would end the answer at its 3rd token
    want = engine.generate(ids, SamplingParams(max_new_tokens=16, min_tokens=6), {stop}).tokens
    assert len(want) > 6
    body = {"prompt": PROMPT, "max_tokens": 16, "temperature": 0, "stop_token_ids": [stop], "min_tokens": 6}
    r = client.post("/v1/completions", json=body).json()
    assert r["usage"]["completion_tokens"] == len(want) and r["choices"][0]["text"] == tok.decode(want)
    assert r["choices"][0]["finish_reason"] == ("stop" if want[-1] == stop else "length")
    early = client.post("/v1/completions", json={**body, "min_tokens": 0}).json()
    assert early["usage"]["completion_tokens"] == 3 and early["choices"][0]["finish_reason"] == "stop"


def test_a_stop_string_before_min_tokens_does_not_cut_the_text(client, ref):
    tok, ids, engine = ref
    toks = engine.generate(ids, SamplingParams(max_new_tokens=24)).tokens
    text, m = tok.decode(toks), 6
    floor = len(tok.decode(toks[:m]))  # the first m tokens' text

    def ends(c: str) -> int:  # the token that completes c's first showing past the floor
        return next(k for k in range(m + 1, len(toks) + 1) if len(tok.decode(toks[:k])) > text.index(c, floor))

    # a character the first tokens show and a token after the (m + 1)-th shows again (then every token since the
    # m-th has the first showing in its tail text): without min_tokens the text ends at once
    stop = next(c for c in tok.decode(toks[:3]) if c.strip() and c in text[floor:] and ends(c) > m + 1)
    cut = text.index(stop, floor)
    body = {"prompt": PROMPT, "max_tokens": 24, "temperature": 0, "stop": stop, "min_tokens": m}
    r = client.post("/v1/completions", json=body).json()
    assert r["choices"][0]["text"] == text[:cut] and r["choices"][0]["finish_reason"] == "stop"
    assert r["usage"]["completion_tokens"] == ends(stop) and stream_text(client, body) == text[:cut]
    early = client.post("/v1/completions", json={**body, "min_tokens": 0}).json()["choices"][0]["text"]
    assert early == text[:text.index(stop)] and len(early) < cut


def test_min_tokens_beyond_the_tokens_to_generate_is_refused(client):
    r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4, "min_tokens": 5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "min_tokens"
    assert "must not exceed the tokens to generate (4)" in r.json()["error"]["message"]
    r = client.post("/v1/completions", json={"prompt": PROMPT, "min_tokens": -1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "min_tokens"


def test_ignore_eos_still_holds_the_end_of_turn_ids_back_for_min_tokens(tiny_target, in_process_app, ref):
    """vLLM masks the end-of-turn ids for min_tokens even when ignore_eos lets generation run past them."""
    tok, ids, engine = ref
    eot = engine.generate(ids, SamplingParams(max_new_tokens=16)).tokens[2]  # served as the end-of-turn id
    body = {"prompt": PROMPT, "max_tokens": 16, "temperature": 0, "ignore_eos": True, "logprobs": 0}
    held = engine.generate(ids, SamplingParams(max_new_tokens=16, min_tokens=6), {eot}).tokens
    with in_process_app(tiny_target, stops=(eot,)) as (asgi, _), TestClient(asgi) as client:
        free = client.post("/v1/completions", json=body).json()["choices"][0]
        r = client.post("/v1/completions", json={**body, "min_tokens": 6}).json()["choices"][0]
    assert free["logprobs"]["tokens"][2] == tok.decode([eot])  # ignore_eos alone: generated, and run past
    assert r["finish_reason"] == "length" and r["text"].startswith(tok.decode(held[:-1]))
    assert tok.decode([eot]) not in r["logprobs"]["tokens"][:6]


def test_stop_reason_names_what_ended_the_choice(client, ref):
    """vLLM's stop_reason: the stop string or the request's stop token id; null at the length."""
    tok, ids, engine = ref
    toks = engine.generate(ids, SamplingParams(max_new_tokens=12)).tokens
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0}
    by_id = client.post("/v1/completions", json={**body, "stop_token_ids": [toks[3]]}).json()["choices"][0]
    assert (by_id["finish_reason"], by_id["stop_reason"]) == ("stop", toks[3])
    stop = tok.decode(toks[2:4]).strip()
    by_string = client.post("/v1/completions", json={**body, "stop": ["never", stop]}).json()["choices"][0]
    assert (by_string["finish_reason"], by_string["stop_reason"]) == ("stop", stop)
    with client.stream("POST", "/v1/completions", json={**body, "stop": stop, "stream": True}) as s:
        parts = [c for line in s.iter_lines() if line.startswith("data: {") for c in json.loads(line[6:])["choices"]]
    assert parts[-1]["stop_reason"] == stop and all(p["stop_reason"] is None for p in parts[:-1])
    ran_out = client.post("/v1/completions", json=body).json()["choices"][0]
    assert (ran_out["finish_reason"], ran_out["stop_reason"]) == ("length", None)


def test_bad_words_and_allowed_token_ids_reach_the_engine(client, ref):
    """vLLM's bad_words (each word as written and with a leading space) and allowed_token_ids: the reply is the
    engine's own run under those bans, and differs from the free one."""
    tok, ids, engine = ref
    free = engine.generate(ids, SamplingParams(max_new_tokens=12)).tokens
    word = tok.decode(free[3]).strip()
    banned = tuple(dict.fromkeys(tuple(tok(t, add_special_tokens=False).input_ids) for t in (word, " " + word)))
    allowed = tuple(sorted(set(free[:6]) | set(range(100, 400))))
    for extra, params in (({"bad_words": [word]}, {"bad_words": banned}),
                          ({"allowed_token_ids": list(allowed)}, {"allowed_token_ids": allowed})):
        want = engine.generate(ids, SamplingParams(max_new_tokens=12, **params)).tokens
        assert want != free
        r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 12, "temperature": 0, **extra}).json()
        assert r["choices"][0]["text"] == tok.decode(want), extra
    for extra in ({"allowed_token_ids": [10 ** 9]}, {"allowed_token_ids": []}, {"bad_words": [" "]}):
        r = client.post("/v1/completions", json={"prompt": PROMPT, **extra})
        assert r.status_code == 400 and r.json()["error"]["param"] == next(iter(extra)), r.text
