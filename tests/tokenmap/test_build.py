"""The real `toolkit build-token-map` CLI: a run on GSM8K with the Llama-3 tokenizer, --from-counts, and
every rejected input."""
import hashlib
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors import safe_open

from toolkit.cli import build_parser, main
from toolkit.models import fingerprint
from toolkit.tokenmap.maps import freq_list, load_counts, load_vocab_map

SIZES = (8192, 16384, 32768)


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "toolkit.cli", *map(str, args)], capture_output=True, text=True)


@pytest.fixture(scope="module")
def llama3_maps(shared, tmp_path_factory):
    out = tmp_path_factory.mktemp("maps")
    data = shared / "data/train/gsm8k_train.jsonl"
    done = run_cli("build-token-map", "--tokenizer", shared / "tokenizers/llama3/tokenizer.json",
                   "--data", data, "--sizes", ",".join(map(str, SIZES)), "--out", out, "--quiet")
    assert done.returncode == 0, done.stderr
    return out, data, done.stdout


def test_real_run_writes_every_artifact_with_its_invariants(llama3_maps):
    out, data, stdout = llama3_maps
    counts, meta = load_counts(out / "token_counts.safetensors")
    assert counts.dtype == np.int64 and counts.shape == (128256,)
    assert int(meta["total_tokens"]) == int(counts.sum()) > 500_000
    assert meta["mode"] == "all" and meta["chat_template"] == "llama3"
    corpus = json.loads(meta["corpus"])
    assert corpus[0]["sha256"] == hashlib.sha256(data.read_bytes()).hexdigest()
    assert corpus[0]["samples"] == 7473 and corpus[0]["bad"] == 0
    cov = json.loads((out / "coverage.json").read_text())
    shares = [cov["sizes"][str(n)] for n in SIZES]
    assert shares == sorted(shares) and 0.9 < shares[0] <= 1.0
    assert (out / "coverage.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for n in SIZES:
        ids = torch.load(out / f"freq_{n}.pt", weights_only=True)
        assert isinstance(ids, list) and len(ids) == n == len(set(ids))
        assert {128000, 128006, 128007, 128009} <= set(ids)  # BOS, header tokens, <|eot_id|> (EOS)
        assert ids[:n - 4] == freq_list(counts, n)[:n - 4]  # most frequent first, ties by id
        d2t, t2d = load_vocab_map(out / f"vocab_map_{n}.safetensors")
        assert d2t.dtype == torch.int64 and d2t.shape == (n,)
        assert t2d.dtype == torch.bool and t2d.shape == (128256,) and int(t2d.sum()) == n
        assert (torch.arange(n) + d2t).tolist() == sorted(ids)
        assert f"{cov['sizes'][str(n)] * 100:.2f}%" in stdout
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temp files left


def test_from_counts_rederives_without_tokenizing(llama3_maps, shared, tmp_path):
    out, _, _ = llama3_maps
    tok = shared / "tokenizers/llama3/tokenizer.json"
    done = run_cli("build-token-map", "--tokenizer", tok, "--from-counts", out / "token_counts.safetensors",
                   "--sizes", "8192,4096", "--out", tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "freq_8192.pt").read_bytes() == (out / "freq_8192.pt").read_bytes()
    counts, _ = load_counts(tmp_path / "token_counts.safetensors")
    assert torch.load(tmp_path / "freq_4096.pt") == freq_list(counts, 4096, [128000, 128006, 128007, 128009])


def test_a_later_run_on_the_same_counts_adds_its_sizes_to_coverage_json(llama3_maps, shared, tmp_path):
    """README's `--from-counts ... --sizes 2048 --out out/maps` into the folder that holds the other sizes: the
    coverage lists every map the folder holds from these counts (it was rewritten with 2048 alone)."""
    import shutil

    out, _, _ = llama3_maps
    shutil.copytree(out, tmp_path / "maps")
    tok = shared / "tokenizers/llama3/tokenizer.json"
    done = run_cli("build-token-map", "--tokenizer", tok, "--from-counts", tmp_path / "maps/token_counts.safetensors",
                   "--sizes", "2048", "--out", tmp_path / "maps")
    assert done.returncode == 0, done.stderr
    before, after = (json.loads((d / "coverage.json").read_text()) for d in (out, tmp_path / "maps"))
    assert set(after["sizes"]) == set(before["sizes"]) | {"2048"}
    assert all(after["sizes"][n] == before["sizes"][n] for n in before["sizes"])
    # a folder whose maps came from other counts lists the new run's sizes only, and the maps its coverage.json
    # listed from those counts are gone (a freq_8192.pt of another corpus read as this one's); a file it never
    # listed is left alone
    (tmp_path / "other").mkdir()
    for f in ("freq_8192.pt", "vocab_map_8192.safetensors"):
        shutil.copy(out / f, tmp_path / "other")
    shutil.copy(out / "freq_8192.pt", tmp_path / "other/freq_777.pt")
    (tmp_path / "other/coverage.json").write_text(json.dumps({**before, "total_tokens": 5}))
    done = run_cli("build-token-map", "--tokenizer", tok, "--from-counts", out / "token_counts.safetensors",
                   "--sizes", "2048", "--out", tmp_path / "other")
    assert done.returncode == 0 and set(json.loads((tmp_path / "other/coverage.json").read_text())["sizes"]) == {"2048"}
    assert "8192" in before["sizes"] and not (tmp_path / "other/freq_8192.pt").exists()
    assert not (tmp_path / "other/vocab_map_8192.safetensors").exists() and (tmp_path / "other/freq_777.pt").exists()
    assert "removed freq_8192.pt, vocab_map_8192.safetensors, which its coverage.json listed" in done.stderr


def test_from_counts_with_another_vocab_is_refused(llama3_maps, shared, tmp_path):
    out, _, _ = llama3_maps
    done = run_cli("build-token-map", "--tokenizer", shared / "tokenizers/qwen2/tokenizer.json",
                   "--from-counts", out / "token_counts.safetensors", "--sizes", "8192", "--out", tmp_path)
    assert done.returncode == 2
    assert "vocab hash" in done.stderr and "tokenizer.json" in done.stderr
    assert list(tmp_path.iterdir()) == []
    bare = tmp_path.parent / "bare_counts.safetensors"  # counts without the build's metadata
    from safetensors.torch import save_file

    save_file({"counts": torch.ones(128256, dtype=torch.int64)}, str(bare))
    done = run_cli("build-token-map", "--tokenizer", shared / "tokenizers/llama3/tokenizer.json",
                   "--from-counts", bare, "--sizes", "8192", "--out", tmp_path)
    assert done.returncode == 2 and "holds no build metadata" in done.stderr and "None" not in done.stderr


def test_default_model_is_the_embedded_smollm2(shared, tmp_path, smollm2_dir):
    done = run_cli("build-token-map", "--data", shared / "data/eval/mt_bench.jsonl", "--sizes", "1024",
                   "--out", tmp_path, "--quiet", "--num-workers", "1")
    assert done.returncode == 0, done.stderr
    ids = torch.load(tmp_path / "freq_1024.pt", weights_only=True)
    assert {1, 2} <= set(ids)  # <|im_start|>, <|im_end|> (EOS)
    _, t2d = load_vocab_map(tmp_path / "vocab_map_1024.safetensors")
    assert t2d.shape == (49152,)
    with safe_open(str(tmp_path / "token_counts.safetensors"), "pt") as f:
        meta = f.metadata()
    assert meta["tokenizer"] == "smollm2-135m-instruct"
    assert meta["target_fingerprint"] == fingerprint(smollm2_dir)


def test_every_id_the_model_stops_on_is_kept(shared, tmp_path, smollm2_dir):
    """A generation config that stops on several ids (Llama-3.1: <|eot_id|>, <|eom_id|>, <|end_of_text|>):
    each is in every map, or a draft served by SGLang / vLLM could never propose it. Our engine stops on them."""
    import json
    import shutil

    from toolkit.data.tokenizer import load_tokenizer
    from toolkit.infer.loading import stop_ids

    model = tmp_path / "model"
    shutil.copytree(smollm2_dir, model)
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 17, 23]}))
    assert stop_ids(load_tokenizer(model=str(model)), model) == {2, 17, 23}
    assert stop_ids(load_tokenizer(model=str(model))) == {2}  # without the folder: the tokenizer's own
    done = run_cli("build-token-map", "--model", model, "--data", shared / "data/eval/mt_bench.jsonl", "--sizes",
                   "8", "--out", tmp_path / "maps", "--quiet", "--num-workers", "1")
    assert done.returncode == 0, done.stderr
    assert {1, 2, 17, 23} <= set(torch.load(tmp_path / "maps" / "freq_8.pt", weights_only=True))


@pytest.fixture()
def no_eos_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    t = Tokenizer(models.BPE(unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.train_from_iterator(["hello world"] * 5, trainers.BpeTrainer(vocab_size=40, special_tokens=["[UNK]"]))
    t.save(str(tmp_path / "tokenizer.json"))
    return tmp_path / "tokenizer.json"


@pytest.mark.parametrize("case, extra, message", [
    ("size zero", ["--sizes", "0"], "1..128256"),
    ("size above vocab", ["--sizes", "8192,200000"], "1..128256"),
    ("size not a number", ["--sizes", "8k"], "comma-separated integers"),
    ("missing file", ["--data", "MISSING"], "not found"),
    ("empty corpus", ["--data", "EMPTY"], "empty corpus"),
    ("all lines broken", ["--data", "BROKEN"], "all 2 records are broken"),
    ("unknown schema", ["--data", "ODD"], "match no schema"),
    ("no eos", ["--tokenizer", "NOEOS"], "no EOS"),
    ("no data", ["--data"], "expected at least one argument"),
    # refused before the corpus is read (this one is empty: its error would come first otherwise)
    ("size below the kept specials", ["--sizes", "3"], "smaller than the 4 special tokens every map keeps"),
    ("batch size zero", ["--batch-size", "0"], "--batch-size 0: must be >= 1"),
    ("thousands of workers", ["--num-workers", "100000"], "--num-workers 100000: this machine gives the process"),
])
def test_bad_input_is_refused_clearly_and_writes_nothing(case, extra, message, shared, tmp_path, capsys,
                                                         no_eos_tokenizer):
    (tmp_path / "empty.jsonl").write_text("\n\n")
    (tmp_path / "broken.jsonl").write_text("{oops\nnope\n")
    (tmp_path / "odd.jsonl").write_text('{"prompt": "p", "completion": "c"}\n')
    subst = {"MISSING": tmp_path / "missing.jsonl", "EMPTY": tmp_path / "empty.jsonl", "NOEOS": no_eos_tokenizer,
             "BROKEN": tmp_path / "broken.jsonl", "ODD": tmp_path / "odd.jsonl"}
    args = {"--tokenizer": shared / "tokenizers/llama3/tokenizer.json", "--data": tmp_path / "empty.jsonl"}
    args = {**{k: [v] for k, v in args.items()}, "--sizes": ["8192"]}
    for i in range(0, len(extra), 2):
        args[extra[i]] = [subst.get(extra[i + 1], extra[i + 1])] if i + 1 < len(extra) else []
    argv = ["build-token-map", "--out", str(tmp_path / "out"), "--quiet"]
    for k, v in args.items():
        argv += [k, *map(str, v)]
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own usage errors
        code = e.code
    assert code == 2, case
    assert message in capsys.readouterr().err, case
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


def test_every_option_is_listed_with_its_default():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, p in sub.choices.items():
        text = p.format_help()
        for action in p._actions:
            if action.dest == "help":
                continue
            assert (action.option_strings or [action.metavar])[0] in text, (name, action.dest)
        said = [a.dest for a in p._actions if a.dest != "help" and "default" in p._get_formatter()._get_help_string(a)]
        assert len(said) == len(p._actions) - 1, (name, said)
        assert "(default 5) (default: None)" not in text  # once, not twice


def test_an_out_that_is_a_file_and_counts_that_are_not_are_refused_in_a_line(shared, tmp_path, capsys):
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "counts.txt").write_text("not safetensors")
    tok = str(shared / "tokenizers/llama3/tokenizer.json")
    assert main(["build-token-map", "--tokenizer", tok, "--data", str(tmp_path / "a_file"), "--sizes", "8192",
                 "--out", str(tmp_path / "a_file"), "--quiet"]) == 2
    assert "is a file; give a folder" in capsys.readouterr().err
    assert main(["build-token-map", "--tokenizer", tok, "--from-counts", str(tmp_path / "counts.txt"),
                 "--sizes", "8192", "--out", str(tmp_path / "out"), "--quiet"]) == 2
    assert "not a safetensors file" in capsys.readouterr().err and not (tmp_path / "out").exists()
    # hand-made counts: NaN ones failed on a conversion, negative ones printed -1600% coverage
    from safetensors.torch import save_file

    for bad in (torch.tensor([1.0, float("nan"), 2.0]), torch.tensor([5, -3, 2]), torch.ones(2, 3, dtype=torch.long),
                torch.zeros(4, dtype=torch.long)):
        save_file({"counts": bad}, str(tmp_path / "bad.safetensors"))
        assert main(["build-token-map", "--tokenizer", tok, "--from-counts", str(tmp_path / "bad.safetensors"),
                     "--sizes", "8192", "--out", str(tmp_path / "out"), "--quiet"]) == 2
        assert "are not one non-negative integer count per token id" in capsys.readouterr().err
        assert not (tmp_path / "out").exists()
    # an --out below a file failed with NotADirectoryError's traceback, after the counting
    assert main(["build-token-map", "--tokenizer", tok, "--data", str(shared / "data/train/gsm8k_train.jsonl"),
                 "--sizes", "8192", "--out", str(tmp_path / "a_file" / "maps"), "--quiet"]) == 2
    assert "a_file is a file, not a folder" in capsys.readouterr().err


def test_sigterm_unwinds_like_ctrl_c_and_leaves_no_temp_file(tmp_path):
    """`timeout` and schedulers stop a run with SIGTERM: the temp file of a write under way is removed and the
    command says so, as it does for Ctrl-C."""
    script = f"""
import os, signal, time
from toolkit import cli
from toolkit.atomic import atomic_path

def busy(args):
    with atomic_path({str(tmp_path / "map.pt")!r}) as tmp:
        tmp.write_text("half")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)

parser = cli.build_parser
def patched():
    p = parser()
    p._subparsers._group_actions[0].choices["build-token-map"].set_defaults(func=busy)
    return p
cli.build_parser = patched
raise SystemExit(cli.main(["build-token-map", "--data", "x", "--out", {str(tmp_path)!r}]))
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 143, run.stderr
    assert "terminated; nothing half-written" in run.stderr
    assert list(tmp_path.iterdir()) == []
