"""`toolkit dump-hidden-states`: parts dumped by separate processes (torchrun ranks) read as one dump, the
target's own states stored, a disk too small refused before the first shard."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from toolkit.cli import main
from toolkit.train.data import HiddenStateShards


def dump(tiny_target, prepared, out, *extra) -> int:
    return main(["dump-hidden-states", "--model", str(tiny_target), "--data", str(prepared), "--out", str(out),
                 "--max-len", "96", "--dtype", "float32", "--shard-size", "5", *extra])


def test_parts_dumped_by_separate_processes_read_as_one_dump(tiny_target, prepared, tmp_path, monkeypatch, capsys):
    """The dump was one process on one GPU (7 of 8 idle); --part I/N (torchrun's RANK / WORLD_SIZE by default)
    dumps every N-th row into OUT/part-I-of-N, and training reads the parts as one dump."""
    assert dump(tiny_target, prepared, tmp_path / "one") == 0
    split = tmp_path / "split"
    assert dump(tiny_target, prepared, split, "--part", "0/2") == 0
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert dump(tiny_target, prepared, split) == 0
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    assert sorted(p.name for p in split.iterdir()) == ["part-0-of-2", "part-1-of-2"]
    one, parts = HiddenStateShards(tmp_path / "one", 96), HiddenStateShards(split, 96)
    assert parts.covers(24) and parts.index["num_samples"] == 24 == one.index["num_samples"]
    assert parts.index["num_tokens"] == one.index["num_tokens"]
    for r in range(24):
        a, b = one[r], parts[r]
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["loss_mask"], b["loss_mask"])
        assert torch.allclose(a["aux"], b["aux"], atol=1e-5) and torch.allclose(a["final_hidden"], b["final_hidden"],
                                                                                atol=1e-5)
    # training reads the parts
    assert main(["train", "--config", "recipes/smollm2-135m-eagle3.yaml", "--model", str(tiny_target), "--data",
                 str(prepared), "--output-dir", str(tmp_path / "run"), "max_steps=1", "batch_size=2", "max_len=96",
                 "eval_samples=2", "eval_max_new_tokens=4", "threads=1", "mixed_precision=no",
                 f"hidden_states={split}"]) == 0
    # a part missing, or parts of another count, are not one dump
    shutil.rmtree(split / "part-1-of-2")
    with pytest.raises(ValueError, match="part-1-of-2 missing"):
        HiddenStateShards(split, 96)
    assert dump(tiny_target, prepared, split, "--part", "1/3") == 0
    with pytest.raises(ValueError, match="parts of \\[2, 3\\] processes"):
        HiddenStateShards(split, 96)
    assert dump(tiny_target, prepared, split, "--part", "3/2") == 2
    assert "--part '3/2': give I/N" in capsys.readouterr().err


def test_the_shards_hold_the_targets_own_states_for_each_row(tiny_target, prepared, tmp_path):
    """Rows go through the target sorted by length, padded in batches, into tensors allocated once per shard:
    each row's stored states are the target's forward over that row alone."""
    from toolkit.infer.loading import load_target
    from toolkit.train.data import PreparedData

    assert dump(tiny_target, prepared, tmp_path / "h", "--batch-size", "3") == 0
    shards, data, target = HiddenStateShards(tmp_path / "h", 96), PreparedData(prepared, 96), load_target(tiny_target)
    layers = json.loads((tmp_path / "h" / "index.json").read_text())["aux_layer_ids"]
    for r in (0, 7, 23):
        ids = data[r]["input_ids"]
        with torch.no_grad():
            _, hs = target(ids[None], aux_layers=layers + [-1])
        assert torch.allclose(shards[r]["aux"], torch.cat(hs[:3], -1)[0], atol=1e-5)
        assert torch.allclose(shards[r]["final_hidden"], hs[3][0], atol=1e-5)


def test_a_dump_the_disk_cannot_hold_is_refused_before_the_first_shard(tiny_target, prepared, tmp_path, monkeypatch,
                                                                        capsys):
    """Several TB for a real corpus: the size is printed, and a disk without the room fails at once, not hours in."""
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=1000))
    assert dump(tiny_target, prepared, tmp_path / "h") == 2
    err = capsys.readouterr().err
    assert "the shards need 0.0 GB and the disk has 0.0 GB free" in err and "bytes a token" in err
    assert not list((tmp_path / "h").glob("shard-*"))


def test_a_target_whose_states_overflow_is_refused_by_row(tiny_target, prepared, tmp_path, monkeypatch, capsys):
    """A target whose float16 range overflows (Gemma's is known to, on a GPU before sm_80) would write inf states
    that train a nan head: the dump stops at the first such batch, naming its rows and --dtype float32."""
    import toolkit.infer.loading as loading

    real = loading.load_target

    def overflowing(*args, **kwargs):
        target = real(*args, **kwargs)
        forward = target.forward

        def inf_at_the_last_row(*a, **k):
            logits, hs = forward(*a, **k)
            hs[1] = hs[1].clone()
            hs[1][-1, 0, 0] = float("inf")
            return logits, hs
        target.forward = inf_at_the_last_row
        return target

    monkeypatch.setattr(loading, "load_target", overflowing)
    assert dump(tiny_target, prepared, tmp_path / "out") != 0
    err = capsys.readouterr().err
    assert "the target's hidden states are not finite (its float32 range overflowed); give --dtype float32" in err
    assert not list((tmp_path / "out").glob("shard-*"))  # nothing half-written


def test_a_resumed_dump_redoes_a_listed_shard_that_was_cut_short(tiny_target, prepared, tmp_path, capsys):
    """A shard listed in index.json but cut short afterwards (a copy, a full disk) was kept by a resumed dump and
    failed training later; now the resume dumps it (and the ones after it) again, and the dump equals a clean one."""
    assert dump(tiny_target, prepared, tmp_path / "clean") == 0
    assert dump(tiny_target, prepared, tmp_path / "h") == 0
    index = json.loads((tmp_path / "h" / "index.json").read_text())
    assert len(index["shards"]) == 5  # 24 rows, 5 a shard
    cut = tmp_path / "h" / index["shards"][2]["file"]
    cut.write_bytes(cut.read_bytes()[:1000])
    capsys.readouterr()
    assert dump(tiny_target, prepared, tmp_path / "h") == 0
    err = capsys.readouterr().err
    assert f"shard {cut}: unreadable" in err and "resuming from it: 3 listed shard(s) dumped again" in err
    assert json.loads((tmp_path / "h" / "index.json").read_text())["shards"] == index["shards"]
    clean, again = HiddenStateShards(tmp_path / "clean", 96), HiddenStateShards(tmp_path / "h", 96)
    for r in range(24):
        assert torch.equal(clean[r]["aux"], again[r]["aux"])
        assert torch.equal(clean[r]["input_ids"], again[r]["input_ids"])


def test_data_prepared_with_another_tokenizer_is_refused_by_dump_and_train(tiny_target, shared, tmp_path, capsys):
    """Llama-3 ids (up to 128k) against a 49k-vocabulary target: an IndexError deep in dump-hidden-states' forward
    (leaving an empty --out), now refused before the target loads, as training refuses it."""
    from toolkit.cli import main

    src = tmp_path / "c.jsonl"
    src.write_text(json.dumps({"messages": [{"role": "user", "content": "Hi"},
                                            {"role": "assistant", "content": "Hello there."}]}) + "\n")
    prepared = tmp_path / "llama"
    assert main(["prepare-data", "--tokenizer", str(shared / "tokenizers/llama3/tokenizer.json"), "--data",
                 str(src), "--out", str(prepared)]) == 0
    assert main(["dump-hidden-states", "--model", str(tiny_target), "--data", str(prepared), "--out",
                 str(tmp_path / "h")]) == 2
    assert "is beyond the target" in capsys.readouterr().err and not (tmp_path / "h").exists()
    assert main(["train", "--model", str(tiny_target), "--data", str(prepared), "--output-dir", str(tmp_path / "r"),
                 "max_steps=1", "eval_samples=0", "threads=1", "mixed_precision=no"]) == 2
    assert "it was prepared with another tokenizer" in capsys.readouterr().err
