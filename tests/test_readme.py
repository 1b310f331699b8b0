"""Every `toolkit ...` command in README.md runs as written (placeholders replaced by real test files)."""
import json
import re
import shlex
import shutil
import subprocess
import sys

from conftest import ROOT

README = (ROOT / "README.md").read_text()


def readme_commands():
    cmds = []
    for block in re.findall(r"```bash\n(.*?)```", README, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():  # a command continued with a backslash is one
            line = line.split(" #")[0].strip()
            for part in line.split("&&"):
                part = part.strip()
                if part.startswith("toolkit "):
                    cmds.append(part)
    return cmds


def test_readme_gives_the_test_command_ci_runs():
    ci = (ROOT / ".ci/run").read_text()
    assert 'pip install -e ".[test]" && pytest -q' in README
    assert """test_cmd='pip install -e ".[test]" && pytest -q'""" in ci


def check_serve(cmd: str, cwd, serve) -> None:
    """A README `toolkit serve` line runs (on a free port), and every README Python block that talks to it
    with the openai client runs against it; then the server stops cleanly."""
    argv = shlex.split(cmd.replace("--port 8000", "--max-seq-len 512"))[2:]
    clients = [b for b in re.findall(r"```python\n(.*?)```", README, flags=re.S) if "OpenAI(" in b]
    assert clients, "README shows no client for toolkit serve"
    with serve(*argv, cwd=cwd) as (base, proc):
        for code in clients:
            done = subprocess.run([sys.executable, "-c", code.replace("http://127.0.0.1:8000", base)],
                                  capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, done.stderr[-2000:]
            assert "'tau'" in done.stdout


def test_every_readme_toolkit_command_runs(tmp_path, shared, smollm2_dir, serve):
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    shutil.copytree(ROOT / "recipes", tmp_path / "recipes")
    (tmp_path / "corpus.jsonl").write_text(json.dumps({"question": "2+2?", "answer": "4"}) + "\n")
    (tmp_path / "more.parquet").write_bytes((tmp_path / "corpus.jsonl").read_bytes())
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"text": "plain words"}]), tmp_path / "more.parquet")
    from toolkit.infer.drafts import random_head, save_eagle3
    from toolkit.infer.config import ModelConfig
    from toolkit.models import fingerprint

    save_eagle3(random_head(ModelConfig.from_folder(smollm2_dir), list(range(0, 49152, 7))), tmp_path / "ckpt",
                json.loads((smollm2_dir / "config.json").read_text()), "smollm2-135m-instruct",
                fingerprint(smollm2_dir))
    subst = {"path/to/tokenizer.json": str(shared / "tokenizers/llama3/tokenizer.json"),
             "--limit 10": "--limit 1 --max-new-tokens 4 --threads 1",  # the same commands, CI-sized
             "--max-new-tokens 64": "--max-new-tokens 8 --limit 3",
             "-o out/batch_answers.jsonl": "-o out/batch_answers.jsonl --max-seq-len 512 --threads 1",
             # FastChat's MT-bench question file, which a user has: the shipped example prompts stand in
             "--prompts question.jsonl": "--prompts examples/prompts.jsonl --limit 1 --max-new-tokens 4 --threads 1"}
    train_budget = " max_steps=2 batch_size=1 eval_max_new_tokens=4 draft_vocab_size=2048 threads=1"
    cmds = readme_commands()
    assert len(cmds) >= 5
    for cmd in cmds:
        for k, v in subst.items():
            cmd = cmd.replace(k, v)
        cmd += train_budget if cmd.startswith("toolkit train ") else ""
        if cmd == "toolkit quickstart":
            continue  # tests/test_quickstart.py runs it (with a CI-sized --minutes)
        if cmd.startswith("toolkit serve "):
            check_serve(cmd, tmp_path, serve)
            continue
        argv = shlex.split(cmd)
        done = subprocess.run([sys.executable, "-m", "toolkit.cli", *argv[1:]], cwd=tmp_path,
                              capture_output=True, text=True)
        assert done.returncode == 0, (cmd, done.stderr[-2000:])
    assert (tmp_path / "out/maps/freq_2048.pt").is_file() and (tmp_path / "out/llama3-maps/freq_32768.pt").is_file()
    assert json.loads((tmp_path / "out/bench.json").read_text())["greedy_identical_to_hf"] is True
    answer = json.loads((tmp_path / "out/model_answer/toolkit.jsonl").read_text().splitlines()[0])
    assert answer["model_id"] == "toolkit" and answer["choices"][0]["turns"][0]
    batch = [json.loads(line) for line in (tmp_path / "out/batch_answers.jsonl").read_text().splitlines()]
    assert [b["custom_id"] for b in batch] == ["hash-map", "haiku", "capital", "sort"]
    assert all(b["response"]["status_code"] == 200 and "speculative" in b["response"]["body"]["usage"] for b in batch)
    for run in ("eagle3", "eagle3-offline", "mtp", "eagle"):
        assert (tmp_path / "out" / run / "draft/model.safetensors").is_file()
