"""A request that names no temperature / top_p / top_k / max_tokens gets the target's generation_config.json
values (`--generation-config auto`, as vLLM), or the neutral ones (`vllm`); its own values always win."""
import json

import pytest
from fastapi.testclient import TestClient

from toolkit.cli import main
from toolkit.serve.defaults import SamplingDefaults, sampling_defaults


def folder_with(tmp_path, cfg: dict):
    (tmp_path / "generation_config.json").write_text(json.dumps(cfg))
    return tmp_path


def test_the_targets_recommended_values_are_read_as_vllm_reads_them(tmp_path):
    qwen3 = folder_with(tmp_path, {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20,
                                   "eos_token_id": [151645, 151643]})
    d = sampling_defaults("auto", qwen3)
    assert (d.temperature, d.top_p, d.top_k, d.max_tokens, d.min_p, d.repetition_penalty) == (0.6, 0.95, 20, None, 0, 1)
    assert sampling_defaults("vllm", qwen3) == SamplingDefaults(source="--generation-config vllm")
    assert sampling_defaults(str(qwen3), None).top_k == 20  # a folder named outright
    assert sampling_defaults("auto", tmp_path / "nothing-here").temperature == 1.0  # no file: neutral
    assert sampling_defaults("auto", None).top_p == 1.0
    (tmp_path / "b").mkdir()
    qwen25 = folder_with(tmp_path / "b", {"top_k": -1, "max_new_tokens": 64, "repetition_penalty": 1.05, "min_p": 0.1})
    d = sampling_defaults("auto", qwen25)  # applied, as vLLM applies them (they were only warned about)
    assert (d.top_k, d.max_tokens, d.repetition_penalty, d.min_p) == (0, 64, 1.05, 0.1)
    assert "min_p 0.1, repetition_penalty 1.05" in d.describe()


@pytest.mark.parametrize("cfg,key", [({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"),
                                     ({"top_k": 2.5}, "top_k"), ({"max_new_tokens": 0}, "max_tokens"),
                                     ({"repetition_penalty": 0}, "repetition_penalty"), ({"min_p": 2}, "min_p")])
def test_values_no_request_could_send_are_refused_naming_the_file(tmp_path, cfg, key):
    with pytest.raises(ValueError, match=f"generation_config.json: {key} .* --generation-config vllm"):
        sampling_defaults("auto", folder_with(tmp_path, cfg))


def test_a_folder_without_the_file_is_refused_before_loading(tmp_path, capsys):
    assert main(["serve", "--no-speculation", "--generation-config", str(tmp_path), "--port", "0"]) == 2
    assert f"--generation-config {tmp_path}: no generation_config.json there" in capsys.readouterr().err


@pytest.fixture
def client(tiny_target, in_process_app):
    greedy = SamplingDefaults(temperature=0.0, top_k=5, max_tokens=5, source="test")
    with in_process_app(tiny_target, stops=(), defaults=greedy) as (asgi, _), TestClient(asgi) as c:
        yield c


def test_defaults_fill_what_a_request_leaves_out_and_its_own_values_win(client):
    def ask(**extra):
        r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], **extra})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"], r.json()["usage"]["completion_tokens"]

    unset = [ask(seed=s) for s in range(3)]  # temperature 0 from the defaults: the seed does not matter
    assert len(set(unset)) == 1 and unset[0][1] == 5  # max_tokens 5 from the defaults
    assert ask(temperature=0, max_tokens=5) == unset[0]
    sampled = {ask(temperature=1.0, top_k=0, seed=s, max_tokens=8)[0] for s in range(4)}  # the request's win
    assert len(sampled) > 1
    assert ask(max_tokens=9)[1] == 9


def test_a_served_repetition_penalty_and_min_p_reach_the_engine(tiny_target, in_process_app):
    """The file's repetition_penalty applies to a request that names none, as the engine's own run with it gives;
    a request's own value (1: off) wins."""
    from toolkit.data.tokenizer import load_tokenizer
    from toolkit.infer.engine import Engine
    from toolkit.infer.loading import load_target
    from toolkit.infer.sampling import SamplingParams

    tok, prompt = load_tokenizer(model=str(tiny_target)), "Once upon a time"
    engine, ids = Engine(load_target(tiny_target), max_len=128), tok(prompt).input_ids
    want = {r: tok.decode(engine.generate(ids, SamplingParams(max_new_tokens=24, repetition_penalty=r)).tokens,
                          skip_special_tokens=True) for r in (1.0, 2.0)}
    assert want[1.0] != want[2.0]  # the penalty changes this model's greedy text
    served = SamplingDefaults(temperature=0.0, repetition_penalty=2.0, min_p=0.5, source="test")
    with in_process_app(tiny_target, stops=(), defaults=served) as (asgi, _), TestClient(asgi) as c:
        def text(**extra):
            r = c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 24, **extra})
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["text"]
        assert text() == want[2.0]
        assert text(repetition_penalty=1.0) == want[1.0]
        assert text(repetition_penalty=None) == want[2.0]  # null: the served default
