"""`toolkit regenerate`: answers turn by turn with the target (engine) or an OpenAI-compatible endpoint, and a
killed run resumes with no duplicate and no gap."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from toolkit.cli import main

CONVS = [
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": "OLD"}, {"role": "user", "content": "More?"},
                  {"role": "assistant", "content": "OLD"}]},
    {"question": "2+2?", "answer": "OLD"},
    {"turns": ["Tell me a joke.", "Another one?"]},
    {"instruction": "Sort these", "input": "3 1 2", "output": "OLD"},
]


@pytest.fixture
def data(tmp_path):
    f = tmp_path / "convs.jsonl"
    f.write_text("".join(json.dumps(c) + "\n" for c in CONVS))
    return f


def read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_engine_answers_every_turn_and_resume_neither_repeats_nor_skips(tiny_target, data, tmp_path):
    full = tmp_path / "full.jsonl"
    args = ["regenerate", "--model", str(tiny_target), "--data", str(data), "--max-new-tokens", "6",
            "--batch-size", "3"]
    assert main(args + ["--out", str(full)]) == 0
    recs = read(full)  # written as each conversation finishes (continuous batching): found by id
    by_id = {r["id"]: r for r in recs}
    assert sorted(by_id) == ["convs.jsonl:0", "convs.jsonl:1", "convs.jsonl:2", "convs.jsonl:3"]
    roles = [m["role"] for m in by_id["convs.jsonl:0"]["messages"]]
    assert roles == ["system", "user", "assistant", "user", "assistant"]
    assert all(m["content"] != "OLD" for r in recs for m in r["messages"])
    first = by_id["convs.jsonl:0"]["messages"]
    assert first[1]["content"] == "Hi" and first[3]["content"] == "More?"
    # continuous batching answers each turn as the target alone does (greedy)
    from toolkit.data.tokenizer import load_tokenizer
    from toolkit.infer.engine import Engine
    from toolkit.infer.loading import load_target
    from toolkit.infer.sampling import SamplingParams

    tok, engine = load_tokenizer(model=str(tiny_target)), Engine(load_target(tiny_target), max_len=2048)
    for r in recs:
        msgs = r["messages"]
        for i, m in enumerate(msgs):
            if m["role"] == "assistant":
                ids = tok(tok.apply_chat_template(msgs[:i], tokenize=False, add_generation_prompt=True),
                          add_special_tokens=False).input_ids
                alone = engine.generate(ids, SamplingParams(max_new_tokens=6), {tok.eos_token_id}).tokens
                assert tok.decode(alone, skip_special_tokens=True).strip() == m["content"], (r["id"], i)
    # a run killed while writing line 3: two whole lines and a torn one
    killed = tmp_path / "killed.jsonl"
    text = full.read_text().splitlines(keepends=True)
    killed.write_text(text[0] + text[1] + text[2][:17])
    assert main(args + ["--out", str(killed)]) == 0
    resumed = read(killed)  # greedy: the resumed file holds the uninterrupted one's lines, each once
    assert len(resumed) == 4 and {r["id"]: r for r in resumed} == by_id
    assert main(args + ["--out", str(killed)]) == 0  # nothing left to do
    assert read(killed) == resumed


def test_engine_answers_in_the_dtype_asked(tiny_target, data, tmp_path, monkeypatch):
    """--dtype bfloat16: the engine's target is loaded in bf16 (~1.5x the answers/s of fp32 on a CPU with native
    bf16, benchmarks/RESULTS.md); a dtype it does not know is refused by name."""
    import torch

    import toolkit.infer.loading as loading

    seen, real = [], loading.load

    def spy(*a, **k):
        loaded = real(*a, **k)
        seen.append(loaded.target.embed_tokens.weight.dtype)
        return loaded

    monkeypatch.setattr(loading, "load", spy)
    out = tmp_path / "bf16.jsonl"
    args = ["regenerate", "--model", str(tiny_target), "--data", str(data), "--max-new-tokens", "6", "--out", str(out)]
    assert main(args + ["--dtype", "bfloat16"]) == 0
    assert seen == [torch.bfloat16] and len(read(out)) == 4
    assert all(m["content"] != "OLD" for r in read(out) for m in r["messages"])
    with pytest.raises(SystemExit):
        main(args + ["--dtype", "int8"])


def test_shards_with_done_files_answer_each_conversation_once(tiny_target, data, tmp_path, capsys):
    """Two processes: shard 0/2 and shard 1/2, the second also skipping what a first, partial run wrote.
    Their files joined are the unsharded output, each id once; a torn line in a --done file is left alone."""
    args = ["regenerate", "--model", str(tiny_target), "--data", str(data), "--max-new-tokens", "6",
            "--batch-size", "3"]
    full = tmp_path / "full.jsonl"
    assert main(args + ["--out", str(full)]) == 0
    want = {r["id"]: r for r in read(full)}
    first = tmp_path / "first.jsonl"  # an earlier run that answered conversation 1 (odd) and was killed
    torn = next(line for line in full.read_text().splitlines(keepends=True) if '"convs.jsonl:1"' in line) \
        + '{"id": "torn'
    first.write_text(torn)
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert main(args + ["--out", str(a), "--shard", "0/2"]) == 0
    assert main(args + ["--out", str(b), "--shard", "1/2", "--done", str(first)]) == 0
    assert first.read_text() == torn  # another process's file is only read
    assert sorted(r["id"] for r in read(a)) == ["convs.jsonl:0", "convs.jsonl:2"]
    assert [r["id"] for r in read(b)] == ["convs.jsonl:3"]
    joined = read(a) + read(b) + [json.loads(torn.splitlines()[0])]
    assert sorted(r["id"] for r in joined) == sorted(want) and all(r == want[r["id"]] for r in joined)
    for bad in ("2/2", "1", "a/b", "-1/2"):
        assert main(args + ["--out", str(tmp_path / "x.jsonl"), f"--shard={bad}"]) == 2
        assert "--shard" in capsys.readouterr().err
    assert main(args + ["--out", str(tmp_path / "x.jsonl"), "--done", str(tmp_path / "missing.jsonl")]) == 2
    assert "--done" in capsys.readouterr().err


class FakeServer(BaseHTTPRequestHandler):
    seen: list = []

    def do_GET(self):  # /v1/models
        self._send({"object": "list", "data": [{"id": "served-model", "object": "model"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeServer.seen.append(body)
        answer = f"answer to {body['messages'][-1]['content']} after {len(body['messages'])} messages"
        self._send({"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": answer}}]})

    def _send(self, obj, status=200):
        raw = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *a):
        pass


def test_endpoint_mode_talks_openai_and_feeds_turn_one_into_turn_two(data, tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        out = tmp_path / "api.jsonl"
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        assert main(["regenerate", "--endpoint", url, "--data", str(data), "--out", str(out),
                     "--max-new-tokens", "32", "--concurrency", "2"]) == 0
    finally:
        server.shutdown()
    # written as each conversation finishes (one task per conversation): found by id
    recs = {r["id"]: r for r in read(out)}
    assert sorted(recs) == [f"convs.jsonl:{i}" for i in range(4)]
    first = recs["convs.jsonl:0"]["messages"]
    assert first[2]["content"] == "answer to Hi after 2 messages"
    assert first[4]["content"] == "answer to More? after 4 messages"
    second_turn = next(b for b in FakeServer.seen if b["messages"][-1]["content"] == "More?")
    assert second_turn["messages"][2] == {"role": "assistant", "content": "answer to Hi after 2 messages"}
    assert {b["model"] for b in FakeServer.seen} == {"served-model"} and second_turn["max_tokens"] == 32
    # MT-bench turns are one conversation: turn 2 is asked after the model's own turn-1 answer
    assert [m["content"] for m in recs["convs.jsonl:2"]["messages"]] == [
        "Tell me a joke.", "answer to Tell me a joke. after 1 messages", "Another one?",
        "answer to Another one? after 3 messages"]
    assert recs["convs.jsonl:2"]["source"] == f"{data}:3"


def test_template_variables_reach_the_engines_prompts_and_the_endpoints_requests(thinking_target, data, tmp_path,
                                                                                monkeypatch):
    """--chat-template-kwargs '{"enable_thinking": false}': the in-process engine's prompts close Qwen3's think block,
    and an endpoint gets the object as chat_template_kwargs (vLLM / SGLang apply it there)."""
    from toolkit.infer.engine import Engine

    prompts, real = [], Engine.admit
    monkeypatch.setattr(Engine, "admit", lambda self, seqs: prompts.extend(q.prompt for q in seqs) or real(self, seqs))
    args = ["regenerate", "--model", str(thinking_target), "--data", str(data), "--max-new-tokens", "4",
            "--limit", "1"]
    assert main(args + ["--out", str(tmp_path / "plain.jsonl")]) == 0
    assert main(args + ["--out", str(tmp_path / "off.jsonl"), "--chat-template-kwargs",
                        '{"enable_thinking": false}']) == 0
    from toolkit.data.tokenizer import load_tokenizer

    tok = load_tokenizer(model=str(thinking_target))
    texts = [tok.decode(ids) for ids in prompts]
    assert len(texts) == 4 and [t.endswith("<think>\n\n</think>\n\n") for t in texts] == [False] * 2 + [True] * 2

    FakeServer.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        for flag, out in (([], "a.jsonl"), (["--chat-template-kwargs", '{"enable_thinking": false}'], "b.jsonl"),
                          (["--chat-template-kwargs", '{"reasoning_effort": "low"}'], "c.jsonl")):
            assert main(["regenerate", "--endpoint", url, "--data", str(data), "--out", str(tmp_path / out),
                         "--limit", "1", *flag]) == 0
    finally:
        server.shutdown()
    off, low = {"enable_thinking": False}, {"reasoning_effort": "low"}
    assert [b.get("chat_template_kwargs") for b in FakeServer.seen] == [None, None, off, off, low, low]  # 2 turns
    # gpt-oss's effort also as the request's own field: vLLM's harmony prompt reads it there, not in the kwargs
    assert [b.get("reasoning_effort") for b in FakeServer.seen] == [None] * 4 + ["low"] * 2


def test_data_files_of_one_name_are_refused(data, tmp_path, capsys):
    """Ids are file name:index: two train.jsonl files would share ids and a resume would skip one's rows."""
    other = tmp_path / "b" / data.name
    other.parent.mkdir()
    other.write_text(data.read_text())
    assert main(["regenerate", "--data", str(data), str(other), "--out", str(tmp_path / "o.jsonl"),
                 "--endpoint", "http://127.0.0.1:9/v1"]) == 2
    assert "share the name(s) ['convs.jsonl']" in capsys.readouterr().err


def test_engine_settings_with_an_endpoint_are_refused(data, tmp_path, capsys):
    """--dtype / --device set the in-process engine; a server answers with its own, so they are refused, not ignored."""
    assert main(["regenerate", "--data", str(data), "--out", str(tmp_path / "o.jsonl"), "--endpoint",
                 "http://127.0.0.1:9/v1", "--dtype", "bfloat16"]) == 2
    assert "with --endpoint the server answers with its own settings" in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists() or (tmp_path / "o.jsonl").read_text() == ""
    assert main(["regenerate", "--data", str(data), "--out", str(tmp_path / "o.jsonl"), "--endpoint",
                 "http://127.0.0.1:9/v1", "--chat-template", "chatml-tools"]) == 2
    assert "a server renders with its own: start it with that template" in capsys.readouterr().err
    assert main(["regenerate", "--data", str(data), "--out", str(tmp_path / "o.jsonl"), "--chat-template",
                 "nope.jinja"]) == 2
    assert "--chat-template nope.jinja: not a file and not one of the built-in templates" in capsys.readouterr().err


def test_several_greedy_samples_are_refused(data, tmp_path, capsys):
    assert main(["regenerate", "--data", str(data), "--out", str(tmp_path / "o.jsonl"), "--num-samples", "2"]) == 2
    assert "temperature" in capsys.readouterr().err


@pytest.mark.parametrize("extra, message", [
    (["--limit", "0"], "--limit 0: give at least 1"), (["--limit", "-2"], "--limit -2"),
    (["--max-len", "0"], "--max-len 0"), (["--threads", "-1"], "--threads -1"),
    (["--temperature", "inf"], "--temperature inf: give a finite number"), (["--top-p", "1.5"], "--top-p 1.5"),
    (["--max-new-tokens", "5000"], "--max-new-tokens 5000 leaves no room for a prompt in --max-len 2048"),
    (["--threads", "100000"], "--threads 100000: give a number of CPU threads from 1 to 1024")])
def test_bad_numbers_are_refused_before_the_target_loads(data, tmp_path, capsys, extra, message):
    """--limit 0 read as 'no conversations with user turns found', --max-len 0 as a too-small KV cache, and
    --temperature inf answered with uniformly random tokens."""
    assert main(["regenerate", "--data", str(data), "--out", str(tmp_path / "o.jsonl"), *extra]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()


@pytest.mark.parametrize("kind, message", [
    ("folder", "--out {p} is a folder"), ("not_ours", "--out {p}: line 1 is not a record regenerate wrote"),
    ("json_array", "--out {p}: its last line is not the start of a record"),
    ("done_folder", "--done {p} is a folder")])
def test_an_out_or_done_that_is_not_a_regenerate_output_is_refused_and_kept(data, tmp_path, capsys, kind, message):
    """--out DIR and --done DIR were IsADirectoryError tracebacks, a file of other JSON said only 'Expecting
    value: line 1 column 1', and a JSON array without a final newline was taken for a torn last line: cut to
    nothing and overwritten."""
    p = tmp_path / "x.json"
    if kind.endswith("folder"):
        p.mkdir()
    else:
        p.write_text({"not_ours": "x\n", "json_array": '[{"a": 1}]'}[kind])
    before = None if p.is_dir() else p.read_text()
    flags = ["--out", str(tmp_path / "o.jsonl"), "--done", str(p)] if kind == "done_folder" else ["--out", str(p)]
    assert main(["regenerate", "--data", str(data), *flags, "--endpoint", "http://127.0.0.1:9/v1"]) == 2
    assert message.format(p=p) in capsys.readouterr().err
    assert before is None or p.read_text() == before


def test_an_out_that_is_the_input_or_holds_other_datas_answers_is_refused_and_kept(data, tmp_path, capsys):
    """--out naming the --data file appended the new answers to the input (a regenerate output fed back in), and an
    --out written from other data was resumed, mixing two sources in one file: both are refused, the file kept."""
    earlier = tmp_path / "earlier.jsonl"
    earlier.write_text('{"id": "gsm8k.jsonl:0", "messages": []}\n')
    for args, message in ((["--data", str(earlier), "--out", str(earlier)], "is one of the --data files"),
                          (["--data", str(data), "--out", str(earlier)], "holds answers to other data (id "
                                                                         "'gsm8k.jsonl:0', not of convs.jsonl)")):
        assert main(["regenerate", *args, "--endpoint", "http://127.0.0.1:9/v1"]) == 2
        assert message in capsys.readouterr().err
        assert earlier.read_text() == '{"id": "gsm8k.jsonl:0", "messages": []}\n'


def test_an_endpoint_that_is_no_url_or_does_not_answer_is_named(data, tmp_path, capsys):
    """A bad --endpoint ended in openai's APIConnectionError traceback."""
    out = tmp_path / "o.jsonl"
    assert main(["regenerate", "--data", str(data), "--out", str(out), "--endpoint", "127.0.0.1:8000"]) == 2
    assert "--endpoint 127.0.0.1:8000: give the server's base URL" in capsys.readouterr().err
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["regenerate", "--data", str(data), "--out", str(out), "--endpoint",
                 f"http://127.0.0.1:{port}/v1", "--model", "m"]) == 2
    assert f"--endpoint http://127.0.0.1:{port}/v1: APIConnectionError" in capsys.readouterr().err


class Misbehaving(FakeServer):
    """An OpenAI server that answers by the last user turn: 500s, context and other 400s, a reasoning parser's
    split answer, no content, an answer cut at max_tokens; else it echoes the request's seed."""
    seen: list = []

    def do_GET(self):
        self._send({"object": "list", "data": [{"id": "m", "object": "model"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Misbehaving.seen.append(body)
        last = body["messages"][-1]["content"]
        message, finish = {"role": "assistant", "content": f"ok seed={body.get('seed')}"}, "stop"
        if last == "POISON":
            return self._send({"error": {"message": "boom", "type": "server_error"}}, 500)
        if last in ("LONG", "BAD"):
            return self._send({"error": {"message": "This model's maximum context length is 64 tokens"
                                         if last == "LONG" else "temperature: bad value", "type": "invalid"}}, 400)
        if last == "THINK":
            message = {"role": "assistant", "content": "42", "reasoning_content": "Six times seven."}
        if last == "EMPTY":
            message, finish = {"role": "assistant", "content": None, "reasoning_content": "Hmm, let me"}, "length"
        if last == "CUT":
            message, finish = {"role": "assistant", "content": "a cut-off ans"}, "length"
        self._send({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                    "choices": [{"index": 0, "finish_reason": finish, "message": message}]})


def misbehaving(tmp_path, turns: list[list[str]], *flags: str) -> tuple[int, dict, list, str]:
    """regenerate against Misbehaving: (exit code, {id: messages}, error records, stderr)."""
    import subprocess
    import sys

    data = tmp_path / "d.jsonl"
    if not data.exists():
        data.write_text("".join(json.dumps({"turns": t}) + "\n" for t in turns))
    server = ThreadingHTTPServer(("127.0.0.1", 0), Misbehaving)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    out = tmp_path / "o.jsonl"
    try:
        done = subprocess.run([sys.executable, "-m", "toolkit.cli", "regenerate", "--endpoint",
                               f"http://127.0.0.1:{server.server_address[1]}/v1", "--data", str(data), "--out",
                               str(out), "--max-retries", "0", "--concurrency", "3", *flags],
                              capture_output=True, text=True)
    finally:
        server.shutdown()
    errors = tmp_path / "o.jsonl.errors.jsonl"
    return (done.returncode, {r["id"]: [m["content"] for m in r["messages"]] for r in read(out)} if out.exists()
            else {}, read(errors) if errors.exists() else [], done.stderr)


def test_a_failing_conversation_fails_alone_and_each_answer_is_kept_as_the_target_wrote_it(tmp_path):
    """One conversation the server always fails no longer ends the run (nor stops every rerun at it); a 400 that is
    not about the context is a failure with the server's reason, not 'prompt too long'; a reasoning parser's
    reasoning is kept beside the answer (and not sent back with the next turn); no content is a failure, not an
    empty turn; cut answers are counted."""
    turns = [["Hi", "CUT", "after"], ["POISON"], ["Hi", "LONG"], ["BAD"], ["THINK", "Hi"], ["EMPTY"]]
    Misbehaving.seen = []
    rc, recs, errors, err = misbehaving(tmp_path, turns)
    assert rc == 1, err  # some failed: said by the exit code too
    assert recs == {"d.jsonl:0": ["Hi", "ok seed=None", "CUT", "a cut-off ans", "after", "ok seed=None"],
                    "d.jsonl:2": ["Hi", "ok seed=None"],  # ended at the turn beyond the context
                    "d.jsonl:4": ["THINK", "42", "Hi", "ok seed=None"]}
    thought = next(r for r in read(tmp_path / "o.jsonl") if r["id"] == "d.jsonl:4")["messages"]
    assert [m.get("reasoning_content") for m in thought] == [None, "Six times seven.", None, None]
    asked = next(b["messages"] for b in Misbehaving.seen
                 if [m["content"] for m in b["messages"]][::2] == ["THINK", "Hi"])
    assert asked[1] == {"role": "assistant", "content": "42"}
    # the cut answer is marked (prepare-data then leaves its end-of-turn token out of the loss), not sent so
    cut = next(r for r in read(tmp_path / "o.jsonl") if r["id"] == "d.jsonl:0")["messages"]
    assert [m.get("truncated") for m in cut] == [None, None, None, True, None, None]
    asked = next(b["messages"] for b in Misbehaving.seen if b["messages"][-1]["content"] == "after")
    assert asked[3] == {"role": "assistant", "content": "a cut-off ans"}
    assert {e["id"]: (e["turn"], e["error"].split(":")[0]) for e in errors} == {
        "d.jsonl:1": (1, "InternalServerError"), "d.jsonl:3": (1, "HTTP 400"),
        "d.jsonl:5": (1, "no answer after the reasoning (it used up --max-new-tokens)")}
    assert "temperature: bad value" in next(e["error"] for e in errors if e["id"] == "d.jsonl:3")
    assert "1 answers cut at --max-new-tokens 512 kept" in err and "1 ended early at a prompt beyond" in err
    assert "3 FAILED, not written" in err
    assert all("seed" not in b and "top_p" not in b for b in Misbehaving.seen)  # the server's own defaults apply
    # a rerun asks the failed conversations again, and only them
    Misbehaving.seen = []
    rc, recs, errors, err = misbehaving(tmp_path, turns)
    assert rc == 1 and len(recs) == 3 and len(errors) == 3
    assert sorted(b["messages"][-1]["content"] for b in Misbehaving.seen) == ["BAD", "EMPTY", "POISON"]


def test_on_length_drop_ends_a_conversation_before_its_cut_answer(tmp_path):
    rc, recs, errors, err = misbehaving(tmp_path, [["Hi", "CUT", "after"]], "--on-length", "drop")
    assert rc == 0 and recs == {"d.jsonl:0": ["Hi", "ok seed=None"]} and errors == []
    assert "1 ended before an answer cut at --max-new-tokens" in err


def test_a_server_failing_everything_stops_the_run_after_many_in_a_row(tmp_path):
    rc, recs, errors, err = misbehaving(tmp_path, [["POISON"]] * 12, "--concurrency", "1")
    assert rc == 2 and recs == {} and len(errors) == 8, err
    assert "the last 8 conversations all failed (the last: InternalServerError" in err


def test_samples_of_a_conversation_get_their_own_seeds(tmp_path):
    """vLLM seeds a generator per request: one seed for all would make --num-samples' samples identical."""
    rc, recs, _, err = misbehaving(tmp_path, [["Hi", "More"]], "--num-samples", "3", "--temperature", "1",
                                   "--seed", "7")
    assert rc == 0, err
    seeds = [m for r in recs.values() for m in r[1::2]]
    assert len(seeds) == 6 and len(set(seeds)) == 6 and all(s.startswith("ok seed=") and s != "ok seed=None"
                                                             for s in seeds)


def test_the_engine_skips_a_conversation_its_template_refuses(tiny_target, tmp_path):
    """A template that refuses a system turn (Gemma's) failed the whole engine run with a traceback."""
    target = tmp_path / "strict"
    target.mkdir()
    for f in tiny_target.iterdir():
        if f.name != "chat_template.jinja":
            (target / f.name).symlink_to(f)
    (target / "chat_template.jinja").write_text(
        "{%- if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{%- endif %}"
        "{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}")
    data = tmp_path / "convs.jsonl"
    data.write_text("".join(json.dumps(c) + "\n" for c in CONVS))  # the first has a system turn
    out = tmp_path / "o.jsonl"
    assert main(["regenerate", "--model", str(target), "--data", str(data), "--out", str(out),
                 "--max-new-tokens", "4"]) == 1
    assert sorted(r["id"] for r in read(out)) == ["convs.jsonl:1", "convs.jsonl:2", "convs.jsonl:3"]
    (error,) = read(tmp_path / "o.jsonl.errors.jsonl")
    assert error["id"] == "convs.jsonl:0" and "System role not supported" in error["error"]


class Named(FakeServer):
    """A server that answers with its own name (`name`), after `delay` seconds, or fails every request (`down`)."""
    name, delay, down, model = "a", 0.0, False, "served-model"

    def do_GET(self):
        self._send({"object": "list", "data": [{"id": self.model, "object": "model"}]})

    def do_POST(self):
        import time

        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.down:
            return self._send({"error": {"message": "overloaded", "type": "server_error"}}, 503)
        time.sleep(self.delay)
        self._send({"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": f"from {self.name}"}}]})


def several(tmp_path, kinds: list[dict], n: int, *flags: str) -> tuple[int, dict]:
    """regenerate n one-turn conversations against one server per kind (Named's attributes): (exit code,
    {id: answer})."""
    data = tmp_path / "many.jsonl"
    data.write_text("".join(json.dumps({"turns": [f"q{i}"]}) + "\n" for i in range(n)))
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), type("S", (Named,), kind)) for kind in kinds]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    out = tmp_path / "o.jsonl"
    try:
        rc = main(["regenerate", "--data", str(data), "--out", str(out), "--max-retries", "0", *flags, "--endpoint",
                   *[f"http://127.0.0.1:{s.server_address[1]}/v1" for s in servers]])
    finally:
        for s in servers:
            s.shutdown()
    return rc, {r["id"]: r["messages"][-1]["content"] for r in read(out)} if out.exists() else {}


def test_several_endpoints_share_the_conversations_by_their_speed(tmp_path, capsys):
    rc, answers = several(tmp_path, [{"name": "fast"}, {"name": "slow", "delay": 0.2}], 24, "--concurrency", "1")
    assert rc == 0 and len(answers) == 24
    by = {name: sum(a == f"from {name}" for a in answers.values()) for name in ("fast", "slow")}
    assert by["slow"] >= 1 and by["fast"] > by["slow"], by  # the slow one is never idle, the fast one takes more
    err = capsys.readouterr().err
    assert "conversations finished per endpoint:" in err and f" {by['fast']}, " in err


def test_a_server_that_fails_everything_is_dropped_and_its_conversations_asked_of_the_others(tmp_path, capsys):
    """A dead node among several costs no conversation: after 8 failures in a row it is dropped and they (and
    those queued on it) go to the live ones; with every server down the run still stops, failures listed."""
    rc, answers = several(tmp_path, [{"name": "up", "delay": 0.1}, {"name": "dead", "down": True}], 32,
                          "--concurrency", "1")
    err = capsys.readouterr().err
    assert rc == 0 and len(answers) == 32 and set(answers.values()) == {"from up"}, err
    assert "dropped: the last 8 conversations all failed (the last: InternalServerError" in err
    assert not (tmp_path / "o.jsonl.errors.jsonl").exists()  # the dead server's conversations are not failures
    (tmp_path / "o.jsonl").unlink()
    rc, answers = several(tmp_path, [{"down": True}, {"down": True}], 24, "--concurrency", "1")
    err = capsys.readouterr().err
    assert rc == 2 and answers == {} and "the last 8 conversations all failed" in err
    assert len(read(tmp_path / "o.jsonl.errors.jsonl")) == 8  # the last server's 8; the first's were asked again


def test_endpoints_of_different_models_or_given_twice_are_refused(tmp_path, capsys):
    rc, _ = several(tmp_path, [{}, {"model": "other-model"}], 2)
    assert rc == 2 and "the servers list different models" in capsys.readouterr().err
    assert main(["regenerate", "--data", str(tmp_path / "many.jsonl"), "--out", str(tmp_path / "o.jsonl"),
                 "--endpoint", "http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1"]) == 2
    assert "a URL given twice" in capsys.readouterr().err


def test_a_tool_conversation_keeps_its_calls_and_results_and_the_target_answers_the_rest(tiny_target, tmp_path,
                                                                                          monkeypatch):
    """The target cannot run tools: an assistant turn that calls them stays as written, with its results, and
    the target answers what follows them (and every other turn). An endpoint is sent the tools, the calls'
    arguments as JSON text with ids, and each result naming its call; the in-process engine renders the tools
    in the template; the output keeps them as the record's `tools`, which prepare-data reads back."""
    from test_tool_data import OPENAI, SHAREGPT, WEATHER

    src = tmp_path / "tools.jsonl"
    src.write_text(json.dumps(OPENAI) + "\n" + json.dumps(SHAREGPT) + "\n")
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    FakeServer.seen = []
    try:
        out = tmp_path / "api.jsonl"
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        assert main(["regenerate", "--endpoint", url, "--data", str(src), "--out", str(out)]) == 0
    finally:
        server.shutdown()
    recs = {r["id"]: r for r in read(out)}
    openai, sharegpt = recs["tools.jsonl:0"], recs["tools.jsonl:1"]
    assert openai["tools"] == [WEATHER] and sharegpt["tools"] == [WEATHER]
    msgs = openai["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    assert msgs[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}  # as written
    assert msgs[5]["content"] == "answer to {\"temp\": \"4C\", \"sky\": \"snow\"} after 5 messages"
    sent = next(b for b in FakeServer.seen if len(b["messages"]) == 5)
    assert sent["tools"] == [WEATHER] and "toolkit_tools" not in sent["messages"][0]
    assert sent["tool_choice"] == "none"  # shown, not called: a server answers auto only with its tool parser on
    assert sent["messages"][2]["tool_calls"][1] == {"id": "c2", "type": "function", "function": {
        "name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}
    rome = next(b for b in FakeServer.seen if len(b["messages"]) == 3)  # ShareGPT's call had no id: one is given
    assert rome["messages"][2]["tool_call_id"] == rome["messages"][1]["tool_calls"][0]["id"]
    # the engine in-process: the tools reach its prompt; prepare-data reads the output back
    from transformers import PreTrainedTokenizerBase

    real, prompts = PreTrainedTokenizerBase.apply_chat_template, []
    monkeypatch.setattr(PreTrainedTokenizerBase, "apply_chat_template",
                        lambda self, *a, **k: prompts.append(real(self, *a, **k)) or prompts[-1])
    local = tmp_path / "local.jsonl"
    assert main(["regenerate", "--model", str(tiny_target), "--data", str(src), "--out", str(local),
                 "--max-new-tokens", "4", "--chat-template", "chatml-tools"]) == 0
    asked = [p for p in prompts if "<tool_response>" in p]
    assert len(asked) == 2 and all('<tools>\n{"type": "function", "function": {"name": "get_weather"' in p
                                   for p in asked)
    assert {r["id"]: r["tools"] for r in read(local)} == {"tools.jsonl:0": [WEATHER], "tools.jsonl:1": [WEATHER]}
    assert main(["prepare-data", "--model", str(tiny_target), "--data", str(local), "--out",
                 str(tmp_path / "prepared"), "--chat-template", "chatml-tools"]) == 0


def test_answer_slots_ask_only_after_a_question_and_keep_the_tools():
    """A greeting before the first user turn is not asked for (strict templates refuse a reply with no question),
    and tool definitions riding on a dropped first message move to the first one kept."""
    from toolkit.data.regen_worklist import answer_slots
    from toolkit.data.schemas import TOOLS

    system, user = {"role": "system", "content": "s"}, {"role": "user", "content": "q"}
    hello, answer = {"role": "assistant", "content": "hello"}, {"role": "assistant", "content": "a"}
    assert answer_slots([system, hello, user, answer]) == [system, user, None]
    assert answer_slots([{**hello, TOOLS: ["t"]}, user, answer]) == [{**user, TOOLS: ["t"]}, None]
