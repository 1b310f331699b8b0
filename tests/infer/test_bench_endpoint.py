"""`toolkit bench --compare-endpoint`: a running server's acceptance read as SGLang reports it (meta_info) and as vLLM
does (/metrics counters around each request), against a `toolkit serve` of the same head and tree, whose τ, accepted
lengths and greedy texts must then equal the engine's own; and the readings rebuilt from counts exactly."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from toolkit.infer.bench_endpoint import from_histogram


def test_accepted_lengths_rebuilt_from_sglangs_histogram():
    assert sorted(from_histogram([2, 0, 3, 1])) == [0, 0, 2, 2, 2, 3]
    assert from_histogram([]) == []


def test_sglangs_meta_info_read_in_each_of_its_forms():
    """The histogram under its new name or its old; without one, the counts spread over the verify steps (τ exact:
    it once read 30 steps of one token where 10 steps accepted 30); no spec keys (no verify step ran): none."""
    from toolkit.infer.bench_endpoint import sglang_accepted

    assert sorted(sglang_accepted({"spec_correct_drafts_histogram": [1, 2], "spec_verify_ct": 3}, 6)) == [0, 1, 1]
    assert sorted(sglang_accepted({"spec_accept_histogram": [0, 0, 1], "spec_verify_ct": 1}, 4)) == [2]

    spread = sglang_accepted({"spec_verify_ct": 10, "spec_num_correct_drafts": 31}, 42)
    assert len(spread) == 10 and sum(spread) == 31 and (sum(spread) + len(spread)) / len(spread) == 4.1
    assert sum(sglang_accepted({"spec_verify_ct": 4, "spec_accept_token_num": 6}, 11)) == 6
    assert sum(sglang_accepted({"spec_verify_ct": 4}, 11)) == 6  # no counts: the tokens after prefill tell them
    assert sglang_accepted({"completion_tokens": 1}, 1) == []  # SGLang wrote no spec keys: no verify step


def test_vllm_counters_give_the_accepted_lengths_the_emitted_tokens_hold():
    """vLLM counts a step's accepted drafts before it cuts the output at EOS / max_tokens: 3 steps that drafted
    (positions 0, 1, 2 accepted by 3, 2, 1 of them: lengths 3, 2, 1) and 10 tokens hold 1 + 9 = 1 + (3+1) + (2+1) +
    (1+1); cut to 8 tokens, the 2 past the stop come off the longest step, so τ counts what was emitted."""
    from toolkit.infer.bench_endpoint import vllm_accepted

    at = {0: 3, 1: 2, 2: 1}
    assert sorted(vllm_accepted(3, at, 10)) == [1, 2, 3]
    assert sorted(vllm_accepted(3, at, 8)) == [1, 1, 2]  # 7 tokens after the prefill: 3 steps + 4 accepted
    assert sorted(vllm_accepted(3, at, 12)) == [0, 0, 1, 2, 3]  # two more steps that drafted nothing


def test_accepted_lengths_rebuilt_from_vllms_counters(monkeypatch):
    """Counters before and after a request: drafts 5, accepted at positions 0, 1, 2 -> 4, 2, 1: steps accepting 0, 1,
    2, 3 tokens are 1, 2, 1, 1; and steps that drafted nothing make up the generated tokens."""
    from toolkit.infer import bench_endpoint
    from toolkit.infer.bench_endpoint import Endpoint
    from toolkit.infer.sampling import SamplingParams

    readings = iter([(10.0, 3.0, {0: 2.0, 1: 1.0}), (15.0, 10.0, {0: 6.0, 1: 3.0, 2: 1.0})])

    def counters(client, root):  # a large /metrics page takes a while to read: the bench's time, not the server's
        time.sleep(0.05)
        return next(readings)

    monkeypatch.setattr(bench_endpoint, "vllm_counters", counters)
    ep = object.__new__(Endpoint)
    ep.kind, ep.model, ep.root, ep.params, ep.stops, ep.seed, ep.asked = "vllm", "m", "", SamplingParams(), [], 0, 0
    ep.client, ep.counter_seconds = None, 0.0
    tokens = list(range(1 + 12 + 2))  # prefill's token, 5 drafting steps (7 accepted + 5 bonus), 2 plain steps
    ep._post = lambda path, body: {"choices": [{"token_ids": tokens}]}
    res = ep.generate([1, 2, 3])
    assert sorted(res.accepted) == [0, 0, 0, 1, 1, 2, 3] and res.tokens == tokens
    assert ep.counter_seconds >= 0.1 and set(res.seconds.values()) == {0.0}  # the server's split is not known


@pytest.fixture(scope="module")
def server(serve, tiny_draft):
    with serve("--draft", str(tiny_draft), "--num-steps", "3", "--topk", "2", "--num-draft-tokens", "5",
               "--max-seq-len", "512", "--prefix-cache-rows", "0") as (base, proc):
        yield base


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
def test_a_server_of_the_same_head_reads_as_the_engine(server, tiny_draft, tmp_path, kind):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"question_id": i, "category": c, "turns": turns}) + "\n" for i, (c, turns)
                               in enumerate([("writing", ["Write a poem about rain.", "Make it shorter."]),
                                             ("math", ["What is 12 times 7?"])])))
    out = tmp_path / "b.json"
    done = subprocess.run([sys.executable, "-m", "toolkit.cli", "bench", "--draft", str(tiny_draft), "--prompts",
                           str(prompts), "--max-new-tokens", "24", "--num-steps", "3", "--topk", "2",
                           "--num-draft-tokens", "5", "--threads", "1", "--compare-endpoint", f"{server}/v1",
                           "--endpoint-kind", kind, "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(out.read_text())
    ours, theirs = r["speculative"], r["endpoint"]
    assert theirs["kind"] == kind and theirs["model"] and r["greedy_identical_to_endpoint"] is True
    for key in ("requests", "tokens", "verify_steps", "tau", "accept_rate_by_position", "accepted_length_histogram"):
        assert theirs[key] == ours[key], key
    assert r["tau_vs_endpoint"] == 1.0 and theirs["per_turn"] == r["per_turn"]
    assert theirs["seconds"]["other"] == theirs["wall_seconds"] and theirs["seconds"]["verify"] == 0.0
    assert f"endpoint ({kind}, {server}/v1): tau" in done.stdout


def test_auto_detects_sglang_on_a_toolkit_server_and_refuses_a_bad_url(server, tiny_draft, tmp_path, capsys):
    import httpx

    from toolkit.cli import main
    from toolkit.infer.bench_endpoint import detect

    with httpx.Client() as client:
        assert detect(client, server) == "sglang"  # it answers SGLang's /get_server_info (and vLLM's /metrics)
    assert main(["bench", "--draft", str(tiny_draft), "--prompts", "p.jsonl", "--compare-endpoint", "localhost:1"]) == 2
    assert "give the server's URL, http://HOST:PORT" in capsys.readouterr().err
