
import numpy as np
import pytest
import torch

from toolkit.tokenmap.maps import (TokenMapError, freq_list, load_freq, load_vocab_map, save_freq,
                                   save_vocab_map, vocab_map)


def test_freq_list_order_ties_and_forced_ids():
    counts = np.array([5, 9, 0, 9, 1, 5, 0, 7], dtype=np.int64)
    assert freq_list(counts, 4) == [1, 3, 7, 0]  # count desc, ties by lower id
    ids = freq_list(counts, 4, forced=[6, 2])  # zero-count specials still get in, at the tail
    assert ids == [1, 3, 2, 6]
    assert freq_list(counts, 8) == [1, 3, 7, 0, 5, 4, 2, 6]
    with pytest.raises(TokenMapError, match="1..8"):
        freq_list(counts, 9)
    with pytest.raises(TokenMapError, match="special tokens"):
        freq_list(counts, 1, forced=[2, 6])


def test_freq_invariants_on_random_counts():
    rng = np.random.default_rng(0)
    counts = rng.zipf(1.3, size=5000).astype(np.int64) * (rng.random(5000) < 0.7)
    forced = [4999, 17, 3]
    for n in (3, 100, 2048, 5000):
        ids = freq_list(counts, n, forced)
        assert len(ids) == n == len(set(ids))
        assert set(forced) <= set(ids)
        keys = [(-counts[i], i) for i in ids]
        assert keys == sorted(keys)
        # nothing left out is more frequent than anything kept (apart from forced ids)
        kept = [i for i in ids if i not in forced]
        left = np.setdiff1d(np.arange(5000), ids)
        if len(kept) and len(left):
            assert counts[left].max() <= counts[kept].min()


def test_vocab_map_round_trip(tmp_path):
    ids = [50, 3, 7, 99, 0]
    d2t, t2d = vocab_map(ids, 100)
    assert d2t.dtype == torch.int64 and d2t.shape == (5,)
    assert t2d.dtype == torch.bool and t2d.shape == (100,) and int(t2d.sum()) == 5
    target = torch.arange(5) + d2t  # SGLang: hot_token_id = d2t + arange
    assert target.tolist() == sorted(ids)
    assert torch.nonzero(t2d).flatten().tolist() == sorted(ids)
    save_vocab_map(tmp_path / "v.safetensors", d2t, t2d, {"size": "5"})
    d2, t2 = load_vocab_map(tmp_path / "v.safetensors")
    assert torch.equal(d2, d2t) and torch.equal(t2, t2d)
    with pytest.raises(TokenMapError):
        vocab_map([1, 1], 10)


def test_freq_file_loads_as_sglang_does(tmp_path, capsys):
    save_freq(tmp_path / "freq_4.pt", [9, 2, 7, 1])
    with open(tmp_path / "freq_4.pt", "rb") as f:
        raw = torch.load(f, weights_only=True)
    assert raw == [9, 2, 7, 1] and isinstance(raw, list)
    assert torch.tensor(raw).dtype == torch.int64
    assert load_freq(tmp_path / "freq_4.pt") == [9, 2, 7, 1]
    assert not list(tmp_path.glob(".*tmp"))
    # FR-Spec's fr.py: ids[:N - 1] + tokenizer.encode(eos) = [BOS, EOS] for Llama-3, BOS already among them
    torch.save([128000, 13, 11, 128000, 128009], tmp_path / "fr_spec.pt")
    assert load_freq(tmp_path / "fr_spec.pt") == [128000, 13, 11, 128009]
    assert "1 repeated id(s) dropped" in capsys.readouterr().err
    # what a user may point --token-map at by mistake: one line each, never a torch traceback
    torch.save([], tmp_path / "empty.pt")
    torch.save([True, 5, 7], tmp_path / "bools.pt")  # True is an int to Python: it was read as id 1
    (tmp_path / "text.pt").write_text("not a pickle")
    from safetensors.torch import save_file

    save_file({"d2t": torch.zeros(4, dtype=torch.int64)}, str(tmp_path / "vocab_map_4.safetensors"))
    for name, message in (("empty.pt", "non-empty list"), ("bools.pt", "list of int token ids"),
                          ("text.pt", "is not a token map"),
                          ("missing.pt", "not found"), ("vocab_map_4.safetensors", "is a safetensors file .* "
                                                        "FR-Spec's freq_N.pt")):
        with pytest.raises(TokenMapError, match=message):
            load_freq(tmp_path / name)
