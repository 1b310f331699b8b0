"""The load-time probe prints the draft's top-1 agreement with the target, and warns when it is near zero."""
import pytest

from toolkit.infer.loading import probe

TEXT = "The quick brown fox jumps over the lazy dog, then runs into the forest to find its friends."


@pytest.fixture(scope="module")
def target_and_tok(tiny_target):
    from toolkit.data.tokenizer import load_tokenizer
    from toolkit.infer.loading import load_target

    return load_target(tiny_target), load_tokenizer(model=str(tiny_target))


def test_a_random_head_gets_the_warning_with_its_figure(target_and_tok, capsys):
    from toolkit.infer.drafts import random_head

    target, tok = target_and_tok
    agree = probe(random_head(target.config, seed=1), target, tok, TEXT)
    err = capsys.readouterr().err
    assert agree < 0.02
    assert f"draft/target top-1 agreement over the target's answer to a probe prompt: {agree:.1%}" in err
    assert "WARNING: the draft almost never agrees with the target" in err


def test_a_head_that_agrees_gets_its_figure_and_no_warning(target_and_tok, capsys, monkeypatch):
    import toolkit.infer.draft_checks

    target, tok = target_and_tok
    monkeypatch.setattr(toolkit.infer.draft_checks, "agreement", lambda head, target, ids, start=0: 0.5)
    assert probe(object(), target, tok, TEXT) == 0.5
    err = capsys.readouterr().err
    assert "top-1 agreement over the target's answer to a probe prompt: 50.0%" in err and "WARNING" not in err


@pytest.mark.parametrize("capability,name,auto", [((7, 5), "Tesla T4", "float16"),
                                                   ((8, 6), "NVIDIA A10", "bfloat16")])
def test_dtype_auto_is_float16_on_a_gpu_without_bf16_and_bfloat16_is_refused_there(monkeypatch, capsys, capability,
                                                                                   name, auto):
    """Before sm_80 there is no bf16 matrix unit (cuBLAS and Triton's tl.dot refuse or emulate it): --dtype auto
    serves in float16 there, saying so; an explicit bfloat16 is refused with what to give instead."""
    import torch

    from toolkit.infer.loading import pick_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert pick_device("auto", "auto") == ("cuda", getattr(torch, auto))
    old = capability < (8, 0)
    assert ("has no bfloat16 matrix unit; serving in float16" in capsys.readouterr().err) == old
    assert pick_device("cuda", "float16") == ("cuda", torch.float16)
    assert pick_device("cuda", "float32") == ("cuda", torch.float32)
    if old:
        with pytest.raises(ValueError, match=r"--dtype bfloat16 needs a GPU of compute capability 8.0 or later .*"
                                             r"this Tesla T4 \(sm_75\) has no bf16 matrix unit: give --dtype float16"):
            pick_device("cuda", "bfloat16")
    else:
        assert pick_device("cuda", "bfloat16") == ("cuda", torch.bfloat16)
    with pytest.raises(ValueError, match="--dtype fp8: give auto, float32, bfloat16 or float16"):
        pick_device("cuda", "fp8")


def test_a_target_larger_than_free_memory_is_refused_before_it_loads(tiny_target, monkeypatch):
    """An 8B target on a 16 GB card, or on a CPU box, stopped half-way in the allocator or the OOM killer; the
    load now names the weights' size in the dtype asked and the memory free, before reading a tensor."""
    import json

    import torch

    from toolkit.infer import kv_cache, loading, target_weights

    params = 49152 * 64 * 2 + 8 * (64 * (64 + 2 * 32 + 64) + 3 * 64 * 128 + 2 * 64) + 64  # tiny_target's
    monkeypatch.setattr(kv_cache, "free_memory_bytes", lambda device: params * 2)  # fits in bf16, not in fp32
    cfg = loading.ModelConfig.from_folder(tiny_target)
    raw = json.loads((tiny_target / "config.json").read_text())
    target_weights.check_weights_fit(tiny_target, cfg, raw, torch.bfloat16, "cpu")
    with pytest.raises(ValueError) as err:
        loading.load_target(tiny_target, torch.float32)
    want = f"takes {params * 4 / 2**30:.1f} GiB in float32 ({params / 1e9:.2f} B parameters) and cpu has"
    assert want in str(err.value)
    assert "a half precision (dtype bfloat16)" in str(err.value)
    monkeypatch.setattr(kv_cache, "free_memory_bytes", lambda device: (_ for _ in ()).throw(OSError("no meminfo")))
    target_weights.check_weights_fit(tiny_target, cfg, raw, torch.float32, "cpu")  # unknown free memory: not refused


def test_load_target_reads_config_json_once(tiny_target, monkeypatch):
    """The folder's config.json is read once per load (it was twice: once for ModelConfig, once for the raw keys),
    so the model is built from the same text its weights are checked against."""
    from toolkit.infer import config, loading

    reads = []
    real = loading.read_json

    def counting(path, *a, **kw):
        reads.append(path.name)
        return real(path, *a, **kw)

    monkeypatch.setattr(loading, "read_json", counting)
    monkeypatch.setattr(config, "read_json", counting)
    loading.load_target(tiny_target)
    assert reads.count("config.json") == 1
