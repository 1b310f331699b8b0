"""Counting by distinct pieces gives exactly the tokenizer's counts, or is not used."""
import glob
from itertools import chain

import numpy as np
import pytest

from toolkit.data.chat import ChatRenderer
from toolkit.data.schemas import read_samples
from toolkit.tokenmap import count as count_mod
from toolkit.tokenmap.count import count_tokens
from toolkit.tokenmap.pieces import PieceCounter

HARD = ["Ünïcödé café ﬁ 日本語 テスト 🤖👍 \u0301e  \t\n\n  x½Ⅷ² 12345 'S 'LL don't",
        "<|im_start|><|im_end|><|eot_id|>x<|begin_of_text|>  \r\n\r\n\t end   ",
        "numbers 1234567 3.14159 -42 1e10 0x1F", "", "   ", "a" * 3000, "\u00e9 vs e\u0301 (NFC matters)"]


def exact_counts(tok, texts):
    encs = tok.backend_tokenizer.encode_batch_fast(texts, add_special_tokens=False)
    return np.bincount(np.fromiter(chain.from_iterable(e.ids for e in encs), dtype=np.int64), minlength=len(tok))


@pytest.mark.parametrize("name", ["smollm2", "llama3", "qwen2"])
def test_piece_counts_equal_tokenizer_counts(name, request, shared):
    tok = request.getfixturevalue(f"{name}_tokenizer")
    render = ChatRenderer(tok).render
    files = sorted(glob.glob(str(shared / "data/*/*")))
    texts = [s if isinstance(s, str) else render(s) for f in files for s in read_samples(f)] + HARD
    counter = PieceCounter.build(tok.backend_tokenizer)
    assert counter is not None
    got = counter.token_counts(*counter.splitter.count_pieces(texts), len(tok))
    assert np.array_equal(got, exact_counts(tok, texts))


def test_count_tokens_uses_pieces_in_worker_processes_and_matches(smollm2_tokenizer, shared):
    files = [shared / "data/train/gsm8k_train.jsonl", shared / "data/eval/mt_bench.jsonl"]
    r = ChatRenderer(smollm2_tokenizer)
    fast = count_tokens(files, r, len(smollm2_tokenizer), batch_size=500, progress=False, num_workers=2)
    slow = count_tokens(files, r, len(smollm2_tokenizer), progress=False, pieces=False)
    assert fast.method == "pieces" and slow.method == "tokenizer"
    assert np.array_equal(fast.counts, slow.counts) and fast.total == slow.total


def test_disagreement_falls_back_to_the_tokenizer(smollm2_tokenizer, shared, monkeypatch, capsys):
    files = [shared / "data/eval/mt_bench.jsonl"]
    r = ChatRenderer(smollm2_tokenizer)
    slow = count_tokens(files, r, len(smollm2_tokenizer), progress=False, pieces=False)
    monkeypatch.setattr(count_mod.PieceCounter, "token_counts", lambda self, p, a, v: np.zeros(v, dtype=np.int64))
    res = count_tokens(files, r, len(smollm2_tokenizer), batch_size=50, progress=False)
    assert res.method == "tokenizer" and np.array_equal(res.counts, slow.counts)
    assert "disagrees" in capsys.readouterr().err


def test_unsupported_pipelines_are_declined(tmp_path):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    t = Tokenizer(models.BPE(unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.train_from_iterator(["hello world"] * 5, trainers.BpeTrainer(vocab_size=40, special_tokens=["[UNK]"]))
    assert PieceCounter.build(t) is None  # not byte-level
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    assert PieceCounter.build(t) is None  # prefix space is added per sequence
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    assert PieceCounter.build(t) is not None
    t.normalizer = normalizers.Lowercase()
    assert PieceCounter.build(t) is None
