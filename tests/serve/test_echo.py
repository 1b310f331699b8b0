"""Completions' `echo`, vLLM's `prompt_logprobs` and batches of prompts, as lm-evaluation-harness's
`local-completions` scores a continuation: token-id prompts in a batch, `echo: true`, `logprobs: 1`,
`max_tokens: 1`, and the sum of `token_logprobs[ctxlen:-1]`. The prompt's figures are the target's own (a
transformers-free engine run with prompt log-probs is the reference), a batch answers as its prompts alone would,
and the echoed text and offsets run on into the completion."""
import json

import pytest
from fastapi.testclient import TestClient

from toolkit.data.tokenizer import load_tokenizer
from toolkit.infer.engine import Engine
from toolkit.infer.loading import load_target
from toolkit.infer.sampling import SamplingParams

PROMPTS = ["The three primary colors are", "Paris is the capital of"]
MESSAGES = [{"role": "user", "content": "Name three colors."}]


@pytest.fixture(scope="module")
def client(tiny_target, in_process_app):
    with in_process_app(tiny_target, stops=()) as (asgi, _), TestClient(asgi) as c:
        yield c


@pytest.fixture(scope="module")
def ref(tiny_target):
    """(tokenizer, run): run(ids, n, top) is a plain engine's greedy run with prompt and token log-probs."""
    tok, engine = load_tokenizer(model=str(tiny_target)), Engine(load_target(tiny_target), max_len=128)
    return tok, lambda ids, n, top: engine.generate(ids, SamplingParams(max_new_tokens=n, logprobs=top,
                                                                        prompt_logprobs=top))


def test_echo_puts_the_prompt_first_in_text_and_logprobs(client, ref):
    tok, run = ref
    ids = tok(PROMPTS[0]).input_ids
    want = run(ids, 4, 2)
    body = {"prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0, "logprobs": 2}
    plain = client.post("/v1/completions", json=body).json()["choices"][0]
    echoed = client.post("/v1/completions", json={**body, "echo": True}).json()["choices"][0]
    assert echoed["text"] == PROMPTS[0] + plain["text"]
    lp, texts = echoed["logprobs"], [tok.decode([t]) for t in ids + want.tokens]
    assert lp["tokens"] == texts and lp["tokens"][len(ids):] == plain["logprobs"]["tokens"]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    figures = [e.logprob for e in want.prompt_logprobs + want.logprobs]
    assert lp["token_logprobs"][1:] == pytest.approx(figures, abs=1e-5)
    assert [list(top) for top in lp["top_logprobs"][1:len(ids)]] == [
        list(dict.fromkeys([tok.decode([e.token])] + [tok.decode([t]) for t, _ in e.top]))
        for e in want.prompt_logprobs]
    assert lp["text_offset"] == [sum(len(t) for t in texts[:i]) for i in range(len(texts))]
    # streamed: the prompt comes once, ahead of the first text, and the pieces join to the same reply
    with client.stream("POST", "/v1/completions", json={**body, "echo": True, "stream": True}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    parts = [c for e in events for c in e["choices"]]
    assert "".join(c["text"] for c in parts) == echoed["text"] and parts[0]["text"].startswith(PROMPTS[0])
    assert [t for c in parts if c["logprobs"] for t in c["logprobs"]["tokens"]] == lp["tokens"]


def test_lm_eval_loglikelihood_requests_score_each_continuation(client, ref):
    """A batch of token-id prompts (context + continuation), as lm-eval sends it: the continuation's log-likelihood
    is the sum over token_logprobs[ctxlen:-1], and it is greedy when each token is its position's likeliest."""
    tok, run = ref
    contexts = [tok(p).input_ids for p in PROMPTS]
    continuations = [tok(" red, green and blue", add_special_tokens=False).input_ids, run(contexts[1], 3, 0).tokens]
    prompts = [c + k for c, k in zip(contexts, continuations)]
    body = {"prompt": prompts, "max_tokens": 1, "temperature": 0, "logprobs": 1, "echo": True, "seed": 1234}
    r = client.post("/v1/completions", json=body).json()
    assert [c["index"] for c in r["choices"]] == [0, 1]
    assert r["usage"]["prompt_tokens"] == sum(len(p) for p in prompts) and r["usage"]["completion_tokens"] == 2
    for choice, context, prompt in zip(sorted(r["choices"], key=lambda c: c["index"]), contexts, prompts):
        lp, want = choice["logprobs"], run(prompt, 1, 1).prompt_logprobs[len(context) - 1:]
        assert sum(lp["token_logprobs"][len(context):-1]) == pytest.approx(sum(e.logprob for e in want), abs=1e-4)
        greedy = all(t == max(top.values()) for t, top in zip(lp["token_logprobs"][len(context):-1],
                                                               lp["top_logprobs"][len(context):-1]))
        assert greedy == all(e.rank == 1 for e in want)
    assert greedy  # the second continuation is the model's own greedy one; the first is not
    assert not all(e.rank == 1 for e in run(prompts[0], 1, 1).prompt_logprobs[len(contexts[0]) - 1:])


def test_a_batch_of_prompts_answers_as_each_prompt_alone(client):
    body = {"prompt": PROMPTS, "max_tokens": 5, "temperature": 0.9, "seed": 7, "n": 2}
    r = client.post("/v1/completions", json=body).json()
    alone = [client.post("/v1/completions", json={**body, "prompt": p}).json() for p in PROMPTS]
    assert [c["index"] for c in r["choices"]] == [0, 1, 2, 3]
    assert [c["text"] for c in r["choices"]] == [c["text"] for a in alone for c in a["choices"]]
    assert r["usage"]["prompt_tokens"] == sum(a["usage"]["prompt_tokens"] for a in alone)
    assert r["usage"]["completion_tokens"] == sum(a["usage"]["completion_tokens"] for a in alone)
    with client.stream("POST", "/v1/completions", json={**body, "stream": True, "echo": True}) as s:
        parts = [c for line in s.iter_lines() if line.startswith("data: {") for c in json.loads(line[6:])["choices"]]
    assert ["".join(c["text"] for c in parts if c["index"] == i) for i in range(4)] == [
        PROMPTS[i // 2] + c["text"] for i, c in enumerate(r["choices"])]


def test_vllm_prompt_logprobs_on_both_endpoints(client, ref):
    tok, run = ref
    ids = tok(PROMPTS[1]).input_ids
    want = run(ids, 2, 3).prompt_logprobs
    r = client.post("/v1/completions", json={"prompt": PROMPTS[1], "max_tokens": 2, "prompt_logprobs": 3}).json()
    got = r["choices"][0]["prompt_logprobs"]
    assert got[0] is None and len(got) == len(ids) and r["choices"][0]["logprobs"] is None
    for entry, e in zip(got[1:], want):
        assert entry[str(e.token)] == {"logprob": pytest.approx(e.logprob, abs=1e-5), "rank": e.rank,
                                       "decoded_token": tok.decode([e.token])}
        assert {int(k) for k in entry} == {e.token} | {t for t, _ in e.top}
        assert [entry[str(t)]["rank"] for t, _ in e.top] == [1, 2, 3]
    chat_ids = tok(tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True),
                   add_special_tokens=False).input_ids
    r = client.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 2, "prompt_logprobs": 0}).json()
    assert len(r["prompt_logprobs"]) == len(chat_ids) and r["prompt_logprobs"][0] is None
    assert [list(e) for e in r["prompt_logprobs"][1:]] == [[str(t)] for t in chat_ids[1:]]
    assert "prompt_logprobs" not in r["choices"][0]


def test_max_tokens_0_with_echo_scores_the_prompt_alone(client, ref):
    """OpenAI's legacy way to score a prompt (vLLM's echo without generation): the prompt's text and figures, no
    completion; without echo, max_tokens 0 is a 400."""
    tok, run = ref
    ids = tok(PROMPTS[0]).input_ids
    want = run(ids, 1, 1).prompt_logprobs
    body = {"prompt": PROMPTS[0], "max_tokens": 0, "echo": True, "logprobs": 1}
    r = client.post("/v1/completions", json=body).json()
    c = r["choices"][0]
    assert c["text"] == PROMPTS[0] and c["finish_reason"] == "length" and c["stop_reason"] is None
    assert c["logprobs"]["tokens"] == [tok.decode([t]) for t in ids]
    assert c["logprobs"]["token_logprobs"][1:] == pytest.approx([e.logprob for e in want], abs=1e-5)
    assert c["prompt_logprobs"][0] is None and len(c["prompt_logprobs"]) == len(ids)  # echo's figures, as vLLM
    assert r["usage"]["completion_tokens"] == 0 and r["usage"]["prompt_tokens"] == len(ids)
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as s:
        parts = [c for line in s.iter_lines() if line.startswith("data: {") for c in json.loads(line[6:])["choices"]]
    assert "".join(p["text"] for p in parts) == PROMPTS[0]
    assert [t for p in parts if p["logprobs"] for t in p["logprobs"]["tokens"]] == c["logprobs"]["tokens"]
    bad = client.post("/v1/completions", json={**body, "echo": False})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"


def test_an_echoed_token_id_prompt_shows_its_special_tokens(client):
    ids = [1, 504, 3458]  # <|im_start|> then text: vLLM decodes a token-id prompt with special tokens shown
    r = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 1, "echo": True, "temperature": 0}).json()
    assert r["choices"][0]["text"].startswith("<|im_start|>")
    plain = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 1, "temperature": 0}).json()
    assert "prompt_logprobs" in plain["choices"][0] and plain["choices"][0]["prompt_logprobs"] is None
