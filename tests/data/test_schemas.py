import json

import pytest

from toolkit.data.schemas import ReadStats, SchemaError, read_places, read_samples, to_samples

U, A = "user", "assistant"


def conv(*pairs):
    return [{"role": r, "content": c} for r, c in pairs]


@pytest.mark.parametrize("record, expected", [
    ({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"},
                   {"role": "assistant", "content": "a"}]}, [conv(("system", "s"), (U, "q"), (A, "a"))]),
    ({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}, [conv((U, "q"), (A, "a"))]),
    ({"instruction": "do", "input": "this", "output": "done"}, [conv((U, "do\n\nthis"), (A, "done"))]),
    ({"instruction": "do", "input": "", "output": "done"}, [conv((U, "do"), (A, "done"))]),
    ({"instruction": "do", "input": "x", "response": "r"}, [conv((U, "do\n\nx"), (A, "r"))]),
    ({"id": 1, "instruction": "do", "instances": [{"input": "", "output": "o1"}, {"input": "i", "output": "o2"}]},
     [conv((U, "do"), (A, "o1")), conv((U, "do\n\ni"), (A, "o2"))]),
    ({"question": "q", "answer": "a"}, [conv((U, "q"), (A, "a"))]),
    ({"question_id": 1, "turns": ["t1", "t2"]}, [conv((U, "t1")), conv((U, "t2"))]),
    ({"text": "plain"}, ["plain"]),
])
def test_every_schema(record, expected):
    assert to_samples(record) == expected


def test_unknown_schema_names_file_line_keys_and_schemas(tmp_path):
    f = tmp_path / "x.jsonl"
    f.write_text('{"question": "q", "answer": "a"}\n{"prompt": "p", "completion": "c"}\n')
    with pytest.raises(SchemaError) as err:
        list(read_samples(f))
    msg = str(err.value)
    assert f"{f}:2" in msg and "['completion', 'prompt']" in msg and "ShareGPT" in msg and "MT-bench" in msg


def test_bad_lines_are_counted_not_fatal(tmp_path):
    f = tmp_path / "x.jsonl"
    f.write_bytes(b'{"question": "q1", "answer": "a1"}\n{"question": broken\n\xff\xfe{"text": 1}\n'
                  b'{"messages": [{"role": "wizard", "content": "x"}]}\n\n{"question": "q2", "answer": "a2"}\n')
    stats = ReadStats(str(f))
    samples = list(read_samples(f, stats))
    assert [s[0]["content"] for s in samples] == ["q1", "q2"]
    assert stats.bad == 3 and stats.records == 3  # parsed: two valid + the bad-role record
    assert any("not UTF-8" in b for b in stats.bad_examples)
    assert any("broken JSON" in b for b in stats.bad_examples)
    assert any("wizard" in b for b in stats.bad_examples)


def test_a_line_nested_past_the_stack_is_one_broken_line(tmp_path):
    """A fuzzed line of 100,000 nested lists stopped the whole run with 'maximum recursion depth exceeded'."""
    f = tmp_path / "x.jsonl"
    f.write_text('{"question": "q1", "answer": "a1"}\n' + "[" * 100_000 + "]" * 100_000 + "\n")
    stats = ReadStats(str(f))
    assert [s[0]["content"] for s in read_samples(f, stats)] == ["q1"]
    assert stats.bad == 1 and any("nested too deep" in b for b in stats.bad_examples)


def test_bad_values_are_counted_with_their_place_and_samples_carry_theirs(tmp_path, capsys):
    """A role that is a list or an object, an instance that is not an object: counted as bad with file:line,
    not a TypeError; every sample's place is its line (#j for a record's j-th of several)."""
    f = tmp_path / "x.jsonl"
    f.write_text('{"messages": [{"role": ["user"], "content": "x"}]}\n'
                 '{"conversations": [{"from": {"a": 1}, "value": "x"}]}\n'
                 '{"instruction": "do", "instances": ["not an object"]}\n'
                 '{"instruction": "do", "instances": [{"output": "o1"}, {"output": "o2"}]}\n'
                 '{"question": "q", "answer": "a"}\n')
    stats = ReadStats(str(f))
    places = [p for p, _ in read_places(f, stats)]
    assert places == [f"{f}:4#0", f"{f}:4#1", f"{f}:5"]
    assert stats.bad == 3 and [b.split(": ")[0] for b in stats.bad_examples] == [f"{f}:1", f"{f}:2", f"{f}:3"]
    stats.warn_bad()  # what prepare-data, regenerate and build-token-map print: one line, the first place and why
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"warning: {f}: 3 bad record(s) skipped, e.g. {f}:1: ")
    assert f"; {f}:2: " in err and f"; {f}:3: " in err  # the first three, not the first alone
    ReadStats(str(f)).warn_bad()  # nothing skipped: nothing said
    assert capsys.readouterr().err == ""


def test_an_unpaired_surrogate_is_a_bad_record_in_every_reader(tmp_path, smollm2_dir, capsys):
    """Valid JSON whose \\uD800 escape is no Unicode: a TypeError from the tokenizer in prepare-data,
    build-token-map and bench; now a bad record named with its place (bench: refused, naming the turn)."""
    from toolkit.cli import main
    from toolkit.infer.prompts import read_prompts

    f = tmp_path / "s.jsonl"
    f.write_text('{"messages": [{"role": "user", "content": "a\\ud800b"}, {"role": "assistant", "content": "x"}]}\n'
                 '{"question": "q", "answer": "a"}\n')
    stats = ReadStats(str(f))
    assert len(list(read_samples(f, stats))) == 1 and stats.bad == 1
    assert "content holds an unpaired surrogate ('\\ud800' at character 1), not valid Unicode" in stats.bad_examples[0]
    assert main(["prepare-data", "--data", str(f), "--out", str(tmp_path / "p")]) == 0
    assert main(["build-token-map", "--data", str(f), "--out", str(tmp_path / "m"), "--sizes", "64"]) == 0
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"turns": ["a\\ud800b"]}\n')
    with pytest.raises(ValueError, match=f"{prompts}:1: a turn holds an unpaired surrogate"):
        read_prompts(str(prompts), None)


def test_mt_bench_turns_join_into_one_conversation_for_regeneration():
    assert to_samples({"turns": ["t1", "t2"]}, joined_turns=True) == [conv((U, "t1"), (U, "t2"))]


def test_all_lines_bad_is_fatal(tmp_path):
    f = tmp_path / "x.jsonl"
    f.write_text("not json\n{also not\n")
    with pytest.raises(SchemaError, match="all 2 records are broken"):
        list(read_samples(f))


def test_json_array_streams_in_small_chunks(tmp_path, monkeypatch):
    from toolkit.data import corpus_files

    records = [{"instruction": f"i{k} ,[]{{}}\" é", "input": "", "response": "r" * (k * 7)} for k in range(50)]
    f = tmp_path / "x.json"
    f.write_text(json.dumps(records, indent=2, ensure_ascii=False))
    stats = ReadStats(str(f))
    items = [rec for _, rec in corpus_files._json_array(f, stats, chunk=7)]
    assert items == records and stats.bad == 0
    f.write_text(json.dumps(records)[:-40])  # truncated file: the last records are bad, the rest read
    stats = ReadStats(str(f))
    items = [rec for _, rec in corpus_files._json_array(f, stats, chunk=13)]
    assert items == records[: len(items)] and len(items) >= 45 and stats.bad == 1


def test_txt_parquet_and_datasets_folder(tmp_path):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "a.txt").write_text("line one\n\nline two\n")
    assert list(read_samples(tmp_path / "a.txt")) == ["line one", "line two"]
    rows = [{"question": f"q{i}", "answer": f"a{i}"} for i in range(3000)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "b.parquet")
    got = list(read_samples(tmp_path / "b.parquet"))
    assert len(got) == 3000 and got[2999] == conv((U, "q2999"), (A, "a2999"))
    datasets.Dataset.from_list(rows[:10]).save_to_disk(str(tmp_path / "ds"))
    assert list(read_samples(tmp_path / "ds")) == [conv((U, r["question"]), (A, r["answer"])) for r in rows[:10]]


def test_missing_file_and_unknown_type(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        list(read_samples(tmp_path / "nope.jsonl"))
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(SchemaError, match="parquet"):
        list(read_samples(tmp_path / "x.csv"))


def test_a_broken_parquet_file_and_a_folder_that_is_no_dataset_are_named(tmp_path):
    """pyarrow's 'Parquet magic bytes not found' and datasets' 'neither a Dataset directory nor ...' named no file
    and nothing that is accepted."""
    (tmp_path / "b.parquet").write_text("garbage\n")
    with pytest.raises(SchemaError, match=r"b\.parquet: not a readable parquet file .*accepted: \.jsonl"):
        list(read_samples(tmp_path / "b.parquet"))
    (tmp_path / "d").mkdir()
    with pytest.raises(SchemaError, match=r"d: a folder, but not a `datasets` folder"):
        list(read_samples(tmp_path / "d"))


def test_a_utf8_byte_order_mark_is_skipped(tmp_path):
    """Editors on Windows save UTF-8 with a byte-order mark: it cost a JSONL file its first record and made a
    JSON array file wholly unreadable."""
    rec = {"question": "q", "answer": "a"}
    files = {"x.jsonl": json.dumps(rec) + "\n" + json.dumps(rec) + "\n", "x.json": json.dumps([rec, rec]),
             "x.txt": "line one\nline two\n"}
    for name, text in files.items():
        (tmp_path / name).write_bytes(b"\xef\xbb\xbf" + text.encode())
        stats = ReadStats(name)
        samples = list(read_samples(tmp_path / name, stats))
        assert stats.bad == 0 and len(samples) == 2, (name, stats)
    assert samples[0] == "line one"
