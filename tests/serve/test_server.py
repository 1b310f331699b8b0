"""The real `toolkit serve` process on a loopback port, on a tiny random target with a random EAGLE-3 tree
draft: the official `openai` client (chat, completions, streaming), outputs equal to plain greedy decoding,
OpenAI-style 4xx errors for bad requests (the server keeps serving), the queue limit, a client that goes
away mid-stream, and a clean stop."""
import json
import signal
import threading
import time

import httpx
import pytest
from openai import OpenAI

from toolkit.cli import main
from toolkit.data.tokenizer import load_tokenizer
from toolkit.infer.engine import Engine
from toolkit.infer.loading import load_target
from toolkit.infer.sampling import SamplingParams

QUESTION = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def server(serve, tiny_target, tiny_draft):
    with serve("--draft", str(tiny_draft), "--served-model-name", "tiny", "--num-steps", "3", "--topk", "2",
                        "--num-draft-tokens", "5", "--max-batch-size", "4", "--max-seq-len", "1024",
                        "--max-queue", "3", "--max-body-bytes", "20000") as (base, proc):
        yield base


@pytest.fixture(scope="module")
def reference(tiny_target):
    """Plain greedy decoding of the same target in this process: what the server must return."""
    tok, engine = load_tokenizer(model=str(tiny_target)), Engine(load_target(tiny_target), max_len=1024)

    def generate(ids: list[int], n: int) -> tuple[str, list[int]]:
        toks = engine.generate(ids, SamplingParams(max_new_tokens=n), {tok.eos_token_id}).tokens
        return tok.decode(toks, skip_special_tokens=True), toks

    def chat(messages, n):
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return generate(tok(text, add_special_tokens=False).input_ids, n)

    return tok, chat, lambda prompt, n: generate(tok(prompt).input_ids, n)


def test_openai_client_chat_completions_and_streaming_equal_plain_greedy(server, reference):
    tok, chat_ref, completion_ref = reference
    assert server.startswith("http://127.0.0.1:")  # loopback unless --host says otherwise
    client = OpenAI(base_url=f"{server}/v1", api_key="unused")
    assert [m.id for m in client.models.list()] == ["tiny"]
    want, toks = chat_ref(QUESTION, 24)
    r = client.chat.completions.create(model="tiny", messages=QUESTION, temperature=0, max_tokens=24)
    assert r.choices[0].message.content == want
    assert r.choices[0].finish_reason == ("stop" if toks[-1] == tok.eos_token_id else "length")
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(tok(tok.apply_chat_template(
        QUESTION, tokenize=False, add_generation_prompt=True), add_special_tokens=False).input_ids), len(toks))
    spec = r.usage.model_extra["speculative"]
    assert spec["verify_steps"] >= 1 and spec["tau"] == pytest.approx((len(toks) - 1) / spec["verify_steps"])  # + the prefill token
    assert len(spec["accept_rate_by_position"]) <= 3 and sum(spec["accepted_length_histogram"]) == spec["verify_steps"]

    chunks = list(client.chat.completions.create(model="tiny", messages=QUESTION, temperature=0, max_tokens=24,
                                                  stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
    assert chunks[-1].usage.completion_tokens == len(toks) and not chunks[-1].choices
    with httpx.stream("POST", f"{server}/v1/chat/completions", json={
            "messages": QUESTION, "temperature": 0, "max_tokens": 6, "stream": True,
            "stream_options": {"include_usage": True}}) as resp:
        raw = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: {")]
    assert all("usage" in c and c["usage"] is None for c in raw[:-1]) and raw[-1]["usage"]["completion_tokens"] == 6
    assert chunks[-2].choices[0].finish_reason == r.choices[0].finish_reason

    want, _ = completion_ref("The three primary colors are", 16)
    c = client.completions.create(model="tiny", prompt="The three primary colors are", temperature=0, max_tokens=16)
    assert c.choices[0].text == want and c.object == "text_completion"
    streamed = client.completions.create(model="tiny", prompt="The three primary colors are", temperature=0,
                                         max_tokens=16, stream=True)
    assert "".join(s.choices[0].text for s in streamed) == want
    # no max_tokens: the legacy endpoint's 16 (OpenAI's and vLLM's), not the rest of the context
    c = httpx.post(f"{server}/v1/completions", json={"prompt": "The three primary colors are", "temperature": 0})
    assert c.json()["choices"][0]["text"] == want and c.json()["usage"]["completion_tokens"] <= 16


def test_stop_strings_and_seeds(server, reference):
    _, chat_ref, _ = reference
    client = OpenAI(base_url=f"{server}/v1", api_key="unused")
    full, _ = chat_ref(QUESTION, 40)
    stop = full[len(full) // 2: len(full) // 2 + 2]
    cut = full[:full.index(stop)]
    for stream in (False, True):
        r = client.chat.completions.create(model="tiny", messages=QUESTION, temperature=0, max_tokens=40,
                                           stop=[stop], stream=stream)
        text = "".join(c.choices[0].delta.content or "" for c in r) if stream else r.choices[0].message.content
        assert text == cut
    sampled = [client.chat.completions.create(model="tiny", messages=QUESTION, temperature=1.0, max_tokens=20,
                                              seed=seed).choices[0].message.content for seed in (5, 5, 6)]
    assert sampled[0] == sampled[1] != sampled[2]


BAD = [  # (body, status, param or None); each gets an OpenAI error object
    (b"{not json", 400, None),
    (b"[1, 2]", 400, None),
    ({"model": "tiny"}, 400, "messages"),
    ({"messages": "hello"}, 400, "messages"),
    ({"messages": QUESTION, "temperature": "hot"}, 400, "temperature"),
    ({"messages": QUESTION, "max_tokens": "ten"}, 400, "max_tokens"),
    ({"messages": QUESTION, "model": "gpt-4o"}, 404, "model"),
    ({"messages": QUESTION, "max_tokens": 0}, 400, "max_tokens"),
    ({"messages": QUESTION, "max_tokens": 5000}, 400, "max_tokens"),
    ({"messages": [{"role": "user", "content": "word " * 1100}]}, 400, "messages"),
    ({"messages": QUESTION, "temperature": -0.5}, 400, "temperature"),
    ({"messages": QUESTION, "top_p": 0}, 400, "top_p"),
    ({"messages": QUESTION, "top_p": 1.5}, 400, "top_p"),
    ({"messages": [{"role": "function", "content": "x"}]}, 400, "messages.0.role"),  # OpenAI's older role
    ({"messages": QUESTION, "n": 4}, 400, "n"),  # more choices than --max-queue 3
    ({"messages": QUESTION, "logit_bias": {"49152": 1}}, 400, "logit_bias"),  # outside the vocabulary
    ({"messages": []}, 400, "messages"),
    # JSON true is neither a count nor a number, "yes" no boolean (each was read as 1 / 1.0 / true)
    ({"messages": QUESTION, "max_tokens": True}, 400, "max_tokens"),
    ({"messages": QUESTION, "temperature": True}, 400, "temperature"),
    ({"messages": QUESTION, "stream": "yes"}, 400, "stream"),
    ({"messages": QUESTION, "logprobs": 0}, 400, "logprobs"),
    ({"messages": QUESTION, "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ({"messages": QUESTION, "max_tokens": 3, "min_tokens": 4}, 400, "min_tokens"),
    ({"messages": QUESTION, "repetition_penalty": True}, 400, "repetition_penalty"),
    ({"messages": QUESTION, "tool_choice": "required"}, 400, "tool_choice"),
    ({"messages": QUESTION, "stop_token_ids": [10 ** 9]}, 400, "stop_token_ids"),
    ({"messages": [{"role": "user"}]}, 400, "messages.0"),
]


@pytest.mark.parametrize("body,status,param", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_requests_get_a_4xx_naming_the_field(server, body, status, param):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(f"{server}/v1/chat/completions", content=content, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"] and err["type"]
    if param:
        assert param.split(".")[0] in err["message"] or status == 404 or "prompt" in err["message"]


def test_oversized_bodies_and_bad_completions_are_refused_and_the_server_keeps_serving(server):
    big = json.dumps({"messages": [{"role": "user", "content": "x" * 30000}]}).encode()
    assert httpx.post(f"{server}/v1/chat/completions", content=big).status_code == 413

    def chunked():  # no Content-Length: the limit still holds
        for _ in range(30):
            yield b"x" * 1000

    r = httpx.post(f"{server}/v1/chat/completions", content=chunked())
    assert r.status_code == 413 and "--max-body-bytes" in r.json()["error"]["message"]
    for body, param in (({"prompt": ["a", "b", "c", "d"]}, "prompt"), ({"prompt": [[1, 2], [1, 10**9]]}, "prompt"),
                        ({"prompt": ["a", "b"], "n": 2}, "prompt"),  # 4 sequences, --max-queue 3
                        ({"prompt": [1, 10**9]}, "prompt"), ({"prompt": ""}, "prompt"),
                        ({"prompt": [True, False]}, "prompt")):
        r = httpx.post(f"{server}/v1/completions", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    # a seed beyond torch's range was a 500 once; unknown paths and methods answer OpenAI error objects too
    r = httpx.post(f"{server}/v1/chat/completions", json={"messages": QUESTION, "max_tokens": 2, "seed": 10 ** 30})
    assert r.status_code == 400 and r.json()["error"]["param"] == "seed", r.text
    r = httpx.post(f"{server}/v1/nothing", json={})
    assert r.status_code == 404 and "/v1/nothing" in r.json()["error"]["message"]
    assert httpx.get(f"{server}/v1/chat/completions").json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(f"{server}/v1/chat/completions", json={"messages": QUESTION, "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    assert httpx.get(f"{server}/health").json()["status"] == "ok"


def test_over_the_queue_limit_gets_429(server):
    codes, messages = [], []

    def ask():
        r = httpx.post(f"{server}/v1/chat/completions", timeout=120,
                       json={"messages": QUESTION, "max_tokens": 400, "temperature": 0})
        codes.append(r.status_code)
        if r.status_code != 200:
            messages.append(r.json()["error"]["message"])

    threads = [threading.Thread(target=ask) for _ in range(12)]  # 3 wait (4 may run), the rest are refused
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(codes) == {200, 429} and codes.count(200) >= 3  # at least the queue itself is served
    assert all("--max-queue 3" in m for m in messages)


def metric(base: str, name: str) -> float:
    text = httpx.get(f"{base}/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")
               or line.startswith(name + "{"))


def test_a_client_leaving_mid_stream_frees_its_slot(server):
    before = metric(server, "toolkit_cancelled_requests_total")
    body = {"messages": QUESTION, "max_tokens": 900, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server}/v1/chat/completions", json=body, timeout=60) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i > 6:
                break  # leave after a few events
    deadline = time.time() + 30
    while httpx.get(f"{server}/health").json()["running"] and time.time() < deadline:
        time.sleep(0.1)
    assert httpx.get(f"{server}/health").json()["running"] == 0
    assert metric(server, "toolkit_cancelled_requests_total") == before + 1
    assert metric(server, "toolkit_verify_steps_total") > 0
    assert 'toolkit_accepted_at_position_total{position="1"}' in httpx.get(f"{server}/metrics").text or \
        metric(server, "toolkit_accepted_tokens_total") == 0


def test_a_client_leaving_a_non_streamed_request_frees_its_slot(server):
    """Tokens flow all the while (every step posts an update), and the server still notices the client left."""
    before = metric(server, "toolkit_cancelled_requests_total")
    body = {"messages": QUESTION, "max_tokens": 900, "temperature": 0}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server}/v1/chat/completions", json=body, timeout=1.5)
    deadline = time.time() + 30
    while httpx.get(f"{server}/health").json()["running"] and time.time() < deadline:
        time.sleep(0.1)
    assert httpx.get(f"{server}/health").json()["running"] == 0
    assert metric(server, "toolkit_cancelled_requests_total") == before + 1


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_leaving_an_n_3_request_frees_every_choice(server, stream):
    before = metric(server, "toolkit_cancelled_requests_total")
    body = {"messages": QUESTION, "max_tokens": 900, "temperature": 1.0, "n": 3, "stream": stream}
    if stream:
        with httpx.stream("POST", f"{server}/v1/chat/completions", json=body, timeout=60) as r:
            for i, _ in enumerate(r.iter_lines()):
                if i > 12:
                    break
    else:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{server}/v1/chat/completions", json=body, timeout=1.5)
    deadline = time.time() + 30
    while httpx.get(f"{server}/health").json()["running"] and time.time() < deadline:
        time.sleep(0.1)
    assert httpx.get(f"{server}/health").json() == {"status": "ok", "running": 0, "waiting": 0}
    assert metric(server, "toolkit_cancelled_requests_total") == before + 1  # one request, however many choices


def test_n_greedy_choices_through_the_tree_draft_equal_plain_greedy(server, reference):
    _, chat, _ = reference
    client = OpenAI(base_url=f"{server}/v1", api_key="unused")
    out = client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=16, temperature=0, n=2)
    assert [c.index for c in out.choices] == [0, 1]
    assert [c.message.content for c in out.choices] == [chat(QUESTION, 16)[0]] * 2
    assert out.usage.completion_tokens == 2 * len(chat(QUESTION, 16)[1])


def test_a_logit_bias_steers_the_speculative_output(server, reference):
    tok, _, _ = reference
    token = tok(" blue", add_special_tokens=False).input_ids[0]
    r = httpx.post(f"{server}/v1/chat/completions", json={"messages": QUESTION, "max_tokens": 8, "temperature": 0,
                                                           "logit_bias": {str(token): 100}})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == tok.decode([token] * 8)


def test_models_retrieve_and_a_fixed_set_of_metric_labels(server):
    client = OpenAI(base_url=f"{server}/v1", api_key="unused")
    card = client.models.retrieve("tiny")
    assert card.id == "tiny" and card.object == "model"
    r = httpx.get(f"{server}/v1/models/other")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    for i in range(20):  # any path a client makes up is counted under one label, not one each
        assert httpx.get(f"{server}/v1/made-up-{i}").status_code == 404
    text = httpx.get(f"{server}/metrics").text
    endpoints = {line.split('endpoint="')[1].split('"')[0] for line in text.splitlines()
                 if line.startswith("toolkit_requests_total{")}
    assert "other" in endpoints and "/v1/models/{id}" in endpoints and not any("made-up" in e for e in endpoints)


def test_model_mismatch_is_refused_with_both_names(tiny_draft, smollm2_dir, capsys):
    assert main(["serve", "--draft", str(tiny_draft), "--model", str(smollm2_dir), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert str(smollm2_dir) in err and str(tiny_draft) in err and "records" in err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_logs_acceptance_and_stops_cleanly(serve, tiny_target, tiny_draft, sig):
    with serve("--draft", str(tiny_draft), "--max-seq-len", "256", "--log-every", "3") as (base, proc):
        r = httpx.post(f"{base}/v1/completions", json={"prompt": "Hello", "max_tokens": 20, "temperature": 0})
        assert r.status_code == 200
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 0
        err = proc.stderr.read()
    assert "accept len" in err and "Traceback" not in err and "toolkit serve: stopped" in err
    # vLLM's line too, over the steps that drafted: log parsers written for vLLM read it
    line = next(x for x in err.splitlines() if "SpecDecoding metrics: Mean acceptance length: " in x)
    accepted, drafted = (int(line.split(f"{k}: ")[1].split(" ")[0]) for k in ("Accepted", "Drafted"))
    assert drafted % 5 == 0 and 0 <= accepted <= drafted  # a chain of 5 (the default) per drafting step
    assert float(line.split("Mean acceptance length: ")[1].split(",")[0]) == pytest.approx(1 + accepted / (drafted / 5),
                                                                                        abs=0.006)


# (--speculative-disable-by-batch-size takes N >= 2, as vLLM's: test_serve_metrics.py checks its plain steps)
@pytest.mark.parametrize("flags", [["--no-speculation"]], ids=["no-speculation"])
def test_plain_decoding_modes_serve_the_draft_target(serve, tiny_target, tiny_draft, reference, flags):
    _, chat_ref, _ = reference
    with serve("--draft", str(tiny_draft), *flags, "--max-seq-len", "256") as (base, proc):
        r = httpx.post(f"{base}/v1/chat/completions", json={"messages": QUESTION, "max_tokens": 12, "temperature": 0})
        one = httpx.post(f"{base}/v1/completions", json={"prompt": "Hi", "max_tokens": 1, "temperature": 0}).json()
    body = r.json()
    assert body["model"] == str(tiny_target)  # the draft's recorded target serves under its own name
    assert body["choices"][0]["message"]["content"] == chat_ref(QUESTION, 12)[0]
    spec = body["usage"]["speculative"]
    assert spec["tau"] == 1.0 and spec["verify_steps"] == body["usage"]["completion_tokens"] - 1
    # one token comes from prefill alone: no verify step, so no tau (it read 0, as if nothing was emitted)
    assert one["usage"]["completion_tokens"] == 1
    assert one["usage"]["speculative"]["verify_steps"] == 0 and one["usage"]["speculative"]["tau"] is None


def test_chat_template_kwargs_reach_the_template_over_the_servers_defaults(serve, thinking_target):
    """vLLM's / SGLang's chat_template_kwargs (Qwen3's enable_thinking) were dropped as an unknown field: a client
    asking for no thinking got the thinking prompt. The server's defaults apply unless a request sets the key."""
    tok = load_tokenizer(model=str(thinking_target))

    def prompt_tokens(**variables) -> int:
        return len(tok(tok.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True, **variables),
                       add_special_tokens=False).input_ids)

    with serve("--model", str(thinking_target), "--no-speculation", "--max-seq-len", "256",
               "--default-chat-template-kwargs", '{"enable_thinking": false}') as (base, proc):
        def ask(**extra):
            return httpx.post(f"{base}/v1/chat/completions", json={"messages": QUESTION, "max_tokens": 2, **extra})

        default, on = ask().json(), ask(chat_template_kwargs={"enable_thinking": True}).json()
        reserved = ask(chat_template_kwargs={"add_generation_prompt": False})
        wrong = ask(chat_template_kwargs=["enable_thinking"])
    assert prompt_tokens(enable_thinking=False) > prompt_tokens()  # + <think>\n\n</think>\n\n
    assert default["usage"]["prompt_tokens"] == prompt_tokens(enable_thinking=False)
    assert on["usage"]["prompt_tokens"] == prompt_tokens(enable_thinking=True) == prompt_tokens()
    assert reserved.status_code == 400 and reserved.json()["error"]["param"] == "chat_template_kwargs"
    assert "add_generation_prompt set how the template is applied" in reserved.json()["error"]["message"]
    assert wrong.status_code == 400 and "chat_template_kwargs" in wrong.json()["error"]["param"]


@pytest.mark.parametrize("kind", ["mtp", "eagle"])
def test_mtp_and_eagle_drafts_serve_as_chains_equal_to_plain_greedy(serve, tiny_target, reference, tmp_path, kind):
    """`toolkit serve --draft` takes the folders toolkit/train/mtp.py and eagle.py write (random weights here),
    with the chain settings MTP is served with."""
    import torch

    from toolkit.infer.config import ModelConfig
    from toolkit.infer.draft_head import draft_config
    from toolkit.infer.eagle2 import Eagle2Head, save_eagle
    from toolkit.infer.mtp import MTPHead, save_mtp
    from toolkit.models import fingerprint

    c, cfg = ModelConfig.from_folder(tiny_target), json.loads((tiny_target / "config.json").read_text())
    torch.manual_seed(0)
    lm_head = torch.randn(c.vocab_size, c.hidden_size)
    head = MTPHead(c, lm_head) if kind == "mtp" else Eagle2Head(draft_config(c), lm_head)
    (save_mtp if kind == "mtp" else save_eagle)(head, tmp_path / kind, cfg, str(tiny_target), fingerprint(tiny_target))
    _, chat_ref, _ = reference
    with serve("--draft", str(tmp_path / kind), "--num-steps", "3", "--topk", "1", "--num-draft-tokens", "4",
               "--max-seq-len", "256", "--sample-draft") as (base, proc):
        r = httpx.post(f"{base}/v1/chat/completions", json={"messages": QUESTION, "max_tokens": 16, "temperature": 0})
        sampled = [httpx.post(f"{base}/v1/chat/completions", json={"messages": QUESTION, "max_tokens": 16,
                                                                   "temperature": 1.0, "seed": 11}) for _ in range(2)]
    body = r.json()
    assert body["choices"][0]["message"]["content"] == chat_ref(QUESTION, 16)[0]  # greedy: top-1 drafts still
    spec = body["usage"]["speculative"]
    assert spec["verify_steps"] >= 1 and len(spec["accept_rate_by_position"]) <= 3
    # --sample-draft: requests that sample draw their drafts from the head; a seed reproduces the text
    assert [x.status_code for x in sampled] == [200, 200]
    assert sampled[0].json()["choices"][0]["message"] == sampled[1].json()["choices"][0]["message"]
    assert sampled[0].json()["usage"]["completion_tokens"] > 0


@pytest.mark.parametrize("flags", [["--no-speculation"], ["--num-steps", "3", "--topk", "2", "--num-draft-tokens", "5"]],
                         ids=["lookup-alone", "tree+lookup"])
def test_prompt_lookup_branch_serves_plain_greedy_output(serve, tiny_draft, reference, flags):
    """--lookup N: the prompt-lookup branch (alone, or grafted onto the head's tree) changes how many target
    forwards a reply takes, never the reply."""
    _, chat_ref, _ = reference
    question = [{"role": "user", "content": "Say 'red green blue red green blue red green blue' again."}]
    with serve("--draft", str(tiny_draft), *flags, "--lookup", "4", "--max-seq-len", "256") as (base, proc):
        r = httpx.post(f"{base}/v1/chat/completions", json={"messages": question, "max_tokens": 40, "temperature": 0})
    body = r.json()
    assert body["choices"][0]["message"]["content"] == chat_ref(question, 40)[0]
    spec = body["usage"]["speculative"]
    assert spec["tau"] > 1.0  # a random target's greedy text loops: lookup finds it
    assert 0 < spec["accepted_from_lookup"] <= spec["accepted_tokens"]
    assert len(spec["accept_rate_by_position"]) == 4  # the branch's depth (--lookup 4 > --num-steps 3)


def test_a_negative_lookup_is_refused(tiny_draft, capsys):
    assert main(["serve", "--draft", str(tiny_draft), "--lookup", "-1", "--port", "0"]) == 2
    assert "--lookup -1" in capsys.readouterr().err


@pytest.mark.parametrize("extra, message", [
    (["--num-draft-tokens", "0"], "--num-draft-tokens 0: must be in 2..6"), (["--log-every", "-1"], "--log-every -1"),
    (["--host", "nosuch.invalid"], "--host nosuch.invalid"),
    (["--no-speculation", "--num-steps", "3", "--sample-draft"], "--num-steps, --sample-draft shape the draft's rounds"),
    (["--no-speculation", "--token-map", "freq.pt"], "--token-map shapes the draft's rounds"),
    (["--default-chat-template-kwargs", "enable_thinking=false"], "--default-chat-template-kwargs 'enable_thinking"),
    (["--reasoning-parser", "granite"], "--reasoning-parser granite: accepted qwen3, deepseek_r1"),
    (["--tool-call-parser", "granite"], "--tool-call-parser granite: accepted hermes, llama3_json, pythonic, mistral"),
    (["--enable-auto-tool-choice"], "--enable-auto-tool-choice needs --tool-call-parser"),
    (["--enable-auto-tool-choice", "--tool-call-parser", "gpt-oss"], "--tool-call-parser openai reads gpt-oss's"),
    (["--chat-template", "nowhere.jinja"], "--chat-template nowhere.jinja: not a file and not one of the built-in")])
def test_bad_flags_are_refused_before_loading(capsys, extra, message):
    """--num-draft-tokens 0 served as the default and --log-every -1 was taken; a host name that does not resolve
    was reported as 'pick another --port'; drafting flags beside --no-speculation were taken and did nothing."""
    assert main(["serve", "--draft", "nowhere", "--port", "0", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "another --port" not in err


def test_stop_token_ids_and_ignore_eos(server, serve, reference, tiny_target, tmp_path):
    """vLLM's sampling extras that load benchmarks send: stop_token_ids end the answer at their first
    occurrence, ignore_eos generates max_tokens past the end-of-turn token the model chose."""
    import shutil

    tok, chat_ref, completion_ref = reference
    _, toks = chat_ref(QUESTION, 24)
    stop = toks[3]
    body = {"messages": QUESTION, "max_tokens": 24, "temperature": 0, "stop_token_ids": [stop]}
    r = httpx.post(f"{server}/v1/chat/completions", json=body, timeout=120).json()
    assert r["usage"]["completion_tokens"] == toks.index(stop) + 1 and r["choices"][0]["finish_reason"] == "stop"
    # the random target never picks its real end-of-turn token: a copy whose tokenizer names a token it does pick
    _, toks = completion_ref("The three primary colors are", 24)
    eos = toks[4]
    target = tmp_path / "target"
    shutil.copytree(tiny_target, target)
    config = json.loads((target / "tokenizer_config.json").read_text())
    config["eos_token"] = tok.convert_ids_to_tokens(eos)
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    with serve("--model", str(target), "--no-speculation", "--max-seq-len", "256") as (base, _):
        body = {"prompt": "The three primary colors are", "max_tokens": 24, "temperature": 0}
        plain = httpx.post(f"{base}/v1/completions", json=body, timeout=120).json()
        forced = httpx.post(f"{base}/v1/completions", json={**body, "ignore_eos": True}, timeout=120).json()
    assert plain["usage"]["completion_tokens"] == toks.index(eos) + 1 and plain["choices"][0]["finish_reason"] == "stop"
    assert forced["usage"]["completion_tokens"] == 24 and forced["choices"][0]["finish_reason"] == "length"


def test_the_printed_url_brackets_an_ipv6_address():
    """`--host ::1` printed http://::1:PORT/v1, which no client parses."""
    import socket

    from toolkit.serve.server import base_url, bind

    sock = bind("127.0.0.1", 0)
    try:
        assert base_url(sock) == f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    finally:
        sock.close()
    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    try:
        sock = bind("::1", 0)
    except ValueError:
        pytest.skip("::1 cannot be bound here")
    try:
        url = base_url(sock)
        assert url == f"http://[::1]:{sock.getsockname()[1]}/v1" and httpx.URL(url).host == "::1"
    finally:
        sock.close()


def test_a_batch_job_over_http_with_the_tree_draft_equals_plain_greedy(server, reference):
    """The Files and Batch APIs through the real server (multipart upload over HTTP, a job sharing the running batch
    with a live request, past --max-queue 3): every answer is plain greedy decoding's."""
    _, chat_ref, _ = reference
    client = OpenAI(base_url=f"{server}/v1", api_key="unused")
    questions = [[{"role": "user", "content": f"Tell me about the number {i}."}] for i in range(6)]
    rows = [{"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": "tiny", "messages": q, "temperature": 0, "max_tokens": 12}}
            for i, q in enumerate(questions)]
    up = client.files.create(file=("q.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode()), purpose="batch")
    batch = client.batches.create(input_file_id=up.id, endpoint="/v1/chat/completions", completion_window="24h")
    live = client.chat.completions.create(model="tiny", messages=QUESTION, temperature=0, max_tokens=8)
    assert live.choices[0].message.content == chat_ref(QUESTION, 8)[0]
    deadline = time.time() + 300
    while (batch := client.batches.retrieve(batch.id)).status != "completed":
        assert time.time() < deadline and batch.status == "in_progress", batch
        time.sleep(0.1)
    out = [json.loads(s) for s in client.files.content(batch.output_file_id).text.splitlines()]
    assert [o["custom_id"] for o in out] == [r["custom_id"] for r in rows] and batch.error_file_id is None
    assert [o["response"]["body"]["choices"][0]["message"]["content"] for o in out] == [
        chat_ref(q, 12)[0] for q in questions]
    spec = batch.model_extra["speculative"]
    assert spec["verify_steps"] > 0 and spec["tau"] >= 1


def test_sglang_generate_with_the_tree_draft_reports_sglang_speculation_keys(server, reference):
    """SGLang's /generate on the real server: plain greedy's text, and meta_info's spec keys as SGLang computes them
    (what SpecForge's and SGLang's acceptance scripts read: accept length = completion_tokens / spec_verify_ct)."""
    _, _, completion_ref = reference
    want, toks = completion_ref("The three primary colors are", 20)
    out = httpx.post(f"{server}/generate", json={"text": "The three primary colors are", "sampling_params": {
        "temperature": 0, "max_new_tokens": 20}}, timeout=120).json()
    assert out["text"] == want and out["output_ids"] == toks
    meta = out["meta_info"]
    steps, accepted = meta["spec_verify_ct"], meta["spec_accept_token_num"]
    assert steps >= 1 and meta["completion_tokens"] == len(toks) == 1 + steps + accepted  # + the prefill token
    assert meta["spec_accept_length"] == pytest.approx(len(toks) / steps)
    assert meta["spec_draft_token_num"] == steps * 4  # --num-draft-tokens 5: 4 drafted per verify step
    assert meta["spec_accept_rate"] == pytest.approx(accepted / (steps * 4))
    assert sum(meta["spec_accept_histogram"]) == steps
    assert sum(k * n for k, n in enumerate(meta["spec_accept_histogram"])) == accepted
    info = httpx.get(f"{server}/get_server_info", timeout=30).json()
    assert (info["speculative_algorithm"], info["speculative_num_steps"], info["speculative_eagle_topk"],
            info["speculative_num_draft_tokens"]) == ("EAGLE3", 3, 2, 5)
    assert info["internal_states"][0]["avg_spec_accept_length"] >= 1.0


def test_vllm_and_sglang_named_metrics_agree_with_the_replies(serve, tiny_draft):
    """/metrics under vLLM's and SGLang's names (dashboards made for either read this server): drafts, draft
    tokens, accepted tokens and acceptance by position as vLLM counts them, equal to what the replies' usage says."""
    from prometheus_client.parser import text_string_to_metric_families

    question = [{"role": "user", "content": "Name three colors."}]
    with serve("--draft", str(tiny_draft), "--served-model-name", "tiny", "--num-steps", "3", "--max-seq-len",
               "256") as (base, proc):
        usages = [httpx.post(f"{base}/v1/chat/completions", json={"messages": question, "max_tokens": n,
                                                                  "temperature": 0}).json()["usage"]
                  for n in (8, 12, 16)]
        samples = {}
        for family in text_string_to_metric_families(httpx.get(f"{base}/metrics").text):
            for s in family.samples:
                key = (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("model_name", "engine"))))
                samples[key] = s.value
                if s.name.startswith(("vllm:", "sglang:")):
                    assert s.labels["model_name"] == "tiny" and s.labels.get("engine", "0") == "0"
    got = lambda name, **labels: samples[(name, tuple(sorted(labels.items())))]  # noqa: E731
    spec = [u["speculative"] for u in usages]
    steps, accepted = sum(s["verify_steps"] for s in spec), sum(s["accepted_tokens"] for s in spec)
    assert got("vllm:spec_decode_num_drafts_total") == steps > 0  # a chain drafts at every verify step
    assert got("vllm:spec_decode_num_draft_tokens_total") == 3 * steps == sum(s["draft_tokens"] for s in spec)
    assert got("vllm:spec_decode_num_accepted_tokens_total") == accepted
    per_pos = [samples.get(("vllm:spec_decode_num_accepted_tokens_per_pos_total", (("position", str(p)),)), 0)
               for p in range(3)]
    assert sum(per_pos) == accepted and per_pos == sorted(per_pos, reverse=True)
    assert all(s["draft_acceptance_rate"] == s["accepted_tokens"] / s["draft_tokens"] for s in spec)
    assert got("vllm:generation_tokens_total") == got("sglang:generation_tokens_total") == \
        sum(u["completion_tokens"] for u in usages)
    assert got("vllm:prompt_tokens_total") == sum(u["prompt_tokens"] for u in usages)
    assert sum(v for (name, _), v in samples.items() if name == "vllm:request_success_total") == 3
    assert got("vllm:e2e_request_latency_seconds_count") == got("sglang:time_to_first_token_seconds_count") == 3
    assert 1 <= got("sglang:spec_accept_length") <= 4
    assert got("vllm:num_requests_running") == got("sglang:num_queue_reqs") == 0
    assert got("vllm:kv_cache_usage_perc") == got("sglang:token_usage") == 0  # nothing running: the cache is free
