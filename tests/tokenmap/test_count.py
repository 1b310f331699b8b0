"""Counts equal a naive reference (per-sample render + encode + Counter) for every schema and both modes."""
import json
from collections import Counter

import numpy as np
import pytest

from toolkit.data.chat import ChatRenderer
from toolkit.data.schemas import read_samples
from toolkit.tokenmap.count import count_tokens

RECORDS = {
    "messages.jsonl": [{"messages": [{"role": "user", "content": "Name a fruit."},
                                     {"role": "assistant", "content": "Apple."},
                                     {"role": "user", "content": "Another?"},
                                     {"role": "assistant", "content": "Banana, then cherry."}]}],
    "sharegpt.jsonl": [{"conversations": [{"from": "human", "value": "Hello there"},
                                          {"from": "gpt", "value": "General Kenobi!"}]}],
    "alpaca.json": [{"instruction": "Translate", "input": "chat", "output": "cat"},
                    {"instruction": "List primes", "input": "", "output": "2, 3, 5, 7"}],
    "gpteacher.json": [{"instruction": "Write code", "input": "", "response": "print('hi')"}],
    "qa.jsonl": [{"question": "What is 6*7?", "answer": "6*7 = 42.\n#### 42"}] * 3,
    "mtbench.jsonl": [{"question_id": 81, "turns": ["Write a poem.", "Now shorter."]}],
    "text.jsonl": [{"text": "Just some plain text, 123."}],
}


def write_corpus(folder):
    paths = []
    for name, recs in RECORDS.items():
        p = folder / name
        p.write_text(json.dumps(recs) if name.endswith(".json") else "\n".join(json.dumps(r) for r in recs))
        paths.append(p)
    (folder / "plain.txt").write_text("A line of text.\nAnother line.\n")
    return paths + [folder / "plain.txt"]


def naive_counts(tok, paths, mode):
    c = Counter()
    eot = tok.eos_token_id
    for p in paths:
        for s in read_samples(p):
            if isinstance(s, str):
                if mode == "all":
                    c.update(tok.encode(s, add_special_tokens=False))
                continue
            if mode == "all":
                c.update(tok.encode(tok.apply_chat_template(s, tokenize=False), add_special_tokens=False))
            else:
                for m in s:
                    if m["role"] == "assistant":
                        c.update(tok.encode(m["content"], add_special_tokens=False) + [eot])
    return c


@pytest.mark.parametrize("name", ["smollm2", "llama3", "qwen2"])
@pytest.mark.parametrize("mode", ["all", "assistant"])
def test_counts_equal_naive_reference(tmp_path, request, name, mode):
    tok = request.getfixturevalue(f"{name}_tokenizer")
    paths = write_corpus(tmp_path)
    res = count_tokens(paths, ChatRenderer(tok), len(tok), mode, batch_size=3, progress=False)
    ref = naive_counts(tok, paths, mode)
    assert res.total == sum(ref.values()) > 0
    got = {i: int(n) for i, n in enumerate(res.counts) if n}
    assert got == dict(ref)
    assert res.skipped_text == (3 if mode == "assistant" else 0)
    assert [s.samples for s in res.files] == [1, 1, 2, 1, 3, 2, 1, 2]


def test_max_tokens_stops_exactly(tmp_path, smollm2_tokenizer):
    paths = write_corpus(tmp_path)
    full = count_tokens(paths, ChatRenderer(smollm2_tokenizer), len(smollm2_tokenizer), progress=False)
    part = count_tokens(paths, ChatRenderer(smollm2_tokenizer), len(smollm2_tokenizer), max_tokens=57,
                        batch_size=2, progress=False)
    assert part.total == 57 and int(part.counts.sum()) == 57
    assert np.all(part.counts <= full.counts)


@pytest.mark.parametrize("pieces", [True, False])
def test_memory_stays_bounded_as_the_corpus_grows(tmp_path, smollm2_tokenizer, pieces):
    """Streaming: the counting process's peak Python memory does not grow with the corpus."""
    import tracemalloc

    rec = {"question": "How many apples are left? " * 20, "answer": "There are 42 apples left. " * 40}
    line = json.dumps(rec) + "\n"
    peaks = []
    for megabytes in (3, 18):
        n = megabytes * 1_000_000 // len(line)
        (tmp_path / "big.jsonl").write_text(line * n)
        tracemalloc.start()
        res = count_tokens([tmp_path / "big.jsonl"], ChatRenderer(smollm2_tokenizer), len(smollm2_tokenizer),
                           batch_size=256, progress=False, num_workers=2, pieces=pieces)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert res.files[0].samples == n and res.method == ("pieces" if pieces else "tokenizer")
    assert peaks[1] < 1.25 * peaks[0] + 1_000_000, peaks  # 6x the corpus, about the same peak


def test_truncation_and_padding_saved_in_tokenizer_json_do_not_cut_counts(tmp_path, shared, qwen2_tokenizer):
    """A tokenizer.json saved by a training run may keep `truncation` / `padding`; the Rust tokenizer counting
    calls directly applied them: every sample was cut to 8 tokens and padded."""
    from toolkit.data.tokenizer import load_tokenizer

    spec = json.loads((shared / "tokenizers/qwen2/tokenizer.json").read_text())
    spec["truncation"] = {"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0}
    spec["padding"] = {"strategy": "BatchLongest", "direction": "Right", "pad_to_multiple_of": None,
                       "pad_id": 151643, "pad_type_id": 0, "pad_token": "<|endoftext|>"}
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    tok = load_tokenizer(tokenizer=str(tmp_path / "tokenizer.json"))
    paths = write_corpus(tmp_path)
    for mode in ("all", "assistant"):
        res = count_tokens(paths, ChatRenderer(tok), len(tok), mode, batch_size=3, progress=False, pieces=False)
        ref = count_tokens(paths, ChatRenderer(qwen2_tokenizer), len(tok), mode, batch_size=3, progress=False,
                           pieces=False)
        assert np.array_equal(res.counts, ref.counts) and res.total > 0


def test_piece_workers_default_to_the_cpus_this_process_may_use(tmp_path, smollm2_tokenizer, monkeypatch):
    """Not the host's count: a container or taskset limited to 1 CPU gets 1 worker, not os.cpu_count()'s 64."""
    import os

    import toolkit.tokenmap.count as count

    seen = []
    real = count._count_by_pieces
    monkeypatch.setattr(count, "_count_by_pieces", lambda *a: seen.append(a[-1]) or real(*a))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    rec = json.dumps({"question": "How many apples?", "answer": "There are 42 apples."})
    (tmp_path / "qa.jsonl").write_text("\n".join([rec] * 600))
    res = count.count_tokens([tmp_path / "qa.jsonl"], ChatRenderer(smollm2_tokenizer), len(smollm2_tokenizer),
                             batch_size=256, progress=False)
    assert res.method == "pieces" and seen == [1]
