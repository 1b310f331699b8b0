"""`toolkit prepare-data`: the loss mask covers exactly the assistant texts (plus the end-of-turn token) for
ChatML (SmolLM2), Llama-3 and Qwen2 templates; truncation is counted; bad input is refused."""
from __future__ import annotations

import json

import datasets
import pytest

from toolkit.cli import main
from toolkit.data.chat import ChatRenderer
from toolkit.data.prepare import tokenize

CONVS = [
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "4, since 2 + 2 = 4."}, {"role": "user", "content": "And 3 * 3?"},
     {"role": "assistant", "content": "9.\n\n```python\nprint(3 * 3)\n```"}],
    [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": " Blue — «bleu» in French. "}],
]


def runs(mask):
    """[start, end) of every run of ones."""
    out, start = [], None
    for i, m in enumerate(list(mask) + [0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out


@pytest.mark.parametrize("name", ["smollm2_tokenizer", "llama3_tokenizer", "qwen2_tokenizer"])
def test_masked_tokens_decode_to_exactly_the_assistant_texts(name, request):
    tok = request.getfixturevalue(name)
    renderer = ChatRenderer(tok)
    rows, counts = tokenize(renderer, CONVS, 4096)
    assert counts == {"truncated": 0, "no_assistant": 0, "bad": 0, "per_turn": 0, "refusal": None} and len(rows) == 2
    for conv, row in zip(CONVS, rows):
        answers = [m["content"] for m in conv if m["role"] == "assistant"]
        spans = runs(row["loss_mask"])
        assert len(spans) == len(answers)
        for (a, b), answer in zip(spans, answers):
            ids = row["input_ids"][a:b]
            end = tok.convert_ids_to_tokens(ids[-1])
            assert ids[-1] in renderer.special and end in ("<|im_end|>", "<|eot_id|>")
            text = tok.decode(ids[:-1])
            assert text in (answer, answer.strip())  # templates that trim content (Llama-3) store it trimmed


def test_prepare_data_cli_writes_the_documented_folder(smollm2_dir, tmp_path, capsys):
    src = tmp_path / "chats.jsonl"
    long = {"messages": [{"role": "user", "content": "Count."}, {"role": "assistant", "content": "one " * 400}]}
    lines = [json.dumps({"messages": c}) for c in CONVS] + [json.dumps(long), "{broken", json.dumps({"text": "x"})]
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "prepared"
    assert main(["prepare-data", "--data", str(src), "--out", str(out), "--max-len", "128"]) == 0
    ds = datasets.load_from_disk(str(out))
    assert ds.column_names == ["input_ids", "loss_mask", "num_tokens", "source"]
    assert len(ds) == 3 and ds[2]["num_tokens"] == 128 and sum(ds[2]["loss_mask"]) > 0
    assert ds[0]["source"] == f"{src}:1" and ds[2]["source"] == f"{src}:{len(CONVS) + 1}"  # file and line
    meta = json.loads((out / "toolkit_prepare.json").read_text())
    assert meta["truncated"] == 1 and meta["bad"] == 1 and meta["plain_text"] == 1 and meta["kept"] == 3
    assert meta["target_fingerprint"]
    err = capsys.readouterr().err  # plain text is said apart from conversations without answers
    assert "without assistant tokens 0, broken 1, plain text 1 (skipped: a draft trains on chat turns" in err
    # an existing folder is kept unless --overwrite
    assert main(["prepare-data", "--data", str(src), "--out", str(out)]) == 2
    assert main(["prepare-data", "--data", str(src), "--out", str(out), "--overwrite"]) == 0
    # --overwrite replaces a prepare-data output only: any other folder's files were deleted
    other = tmp_path / "notes"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    assert main(["prepare-data", "--data", str(src), "--out", str(other), "--overwrite"]) == 2
    assert (other / "notes.txt").read_text() == "mine"
    assert "holds files and is not a prepare-data output" in capsys.readouterr().err
    (tmp_path / "afile").write_text("x")
    assert main(["prepare-data", "--data", str(src), "--out", str(tmp_path / "afile")]) == 2
    assert "pass --overwrite" not in capsys.readouterr().err  # it could not help: a file is no folder
    # the rows are staged beside --out, not in $TMPDIR (a small or in-memory /tmp failed a big corpus at its end)
    import tempfile

    nowhere = tmp_path / "no-tmp"  # never made: a staging file there would fail
    real = tempfile.tempdir
    tempfile.tempdir = str(nowhere)
    try:
        assert main(["prepare-data", "--data", str(src), "--out", str(out), "--overwrite"]) == 0
    finally:
        tempfile.tempdir = real
    assert not nowhere.exists() and not [p.name for p in tmp_path.iterdir() if ".prepare-" in p.name]


def test_no_assistant_tokens_is_a_clear_error(tmp_path, capsys):
    src = tmp_path / "q.jsonl"
    src.write_text(json.dumps({"turns": ["Hello?"]}) + "\n" + json.dumps({"text": "plain"}) + "\n")
    assert main(["prepare-data", "--data", str(src), "--out", str(tmp_path / "o")]) == 2
    assert "no sample with assistant tokens" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("kind", ["missing", "broken", "not_a_dataset_folder"])
def test_bad_data_is_a_one_line_error(smollm2_dir, tmp_path, capsys, kind):
    """An error raised while reading --data (inside datasets' generator, which wraps it) reaches the user as
    the reader's own one-line message, not as a DatasetGenerationError traceback."""
    src = tmp_path / {"missing": "nosuch.jsonl", "broken": "b.jsonl", "not_a_dataset_folder": "d"}[kind]
    if kind == "broken":
        src.write_text('{"messages": 5}\n')
    elif kind == "not_a_dataset_folder":
        src.mkdir()
    assert main(["prepare-data", "--data", str(src), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert {"missing": "not found", "broken": "all 1 records are broken",
            "not_a_dataset_folder": "not a `datasets` folder"}[kind] in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


# Qwen3's rule for thinking, written small: an answer before the last user turn is rendered without its
# `<think>...</think>` block; one after it always with a think block (empty when the answer has none)
QWEN3_LIKE = (
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for m in messages %}{%- if m['role'] == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}"
    "{%- endfor %}"
    "{%- for m in messages %}{%- set content = m['content'] %}{%- set reasoning = '' %}"
    "{%- if m['role'] == 'assistant' and '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{%- if m['role'] == 'assistant' and loop.index0 > ns.last_user %}"
    "{%- set content = '<think>\\n' + reasoning + '\\n</think>\\n\\n' + content %}{%- endif %}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
THOUGHT = [{"role": "user", "content": "What is 6 * 7?"},
           {"role": "assistant", "content": "<think>\nSix sevens: 42.\n</think>\n\n42."},
           {"role": "user", "content": "And 6 * 8?"},
           {"role": "assistant", "content": "<think>\nOne more six: 48.\n</think>\n\n48."}]


@pytest.fixture()
def qwen3_like(qwen2_tokenizer):
    import copy

    tok = copy.deepcopy(qwen2_tokenizer)
    tok.chat_template = QWEN3_LIKE
    return tok


def test_a_template_that_drops_earlier_thinking_gives_one_sample_per_answer(qwen3_like):
    """Qwen3 renders turn 1's answer without its thinking once turn 2 follows, so the whole conversation cannot
    hold turn 1 as the target wrote it: each answer becomes a sample of the conversation up to it, as the target
    read it when it wrote that answer (the prompt a server renders), with that answer, thinking included, masked."""
    renderer = ChatRenderer(qwen3_like)
    plain = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
             {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Bye."}]
    rows, counts = tokenize(renderer, [THOUGHT, plain], 4096)
    assert counts == {"truncated": 0, "no_assistant": 0, "bad": 0, "per_turn": 1, "refusal": None}
    assert [(r["index"], r["turn"]) for r in rows] == [(0, 1), (0, 2), (1, 0)]  # the plain one stays whole
    for row, k in zip(rows[:2], (1, 3)):
        (a, b), = runs(row["loss_mask"])
        assert qwen3_like.decode(row["input_ids"][a:b]) == THOUGHT[k]["content"] + "<|im_end|>"
        prompt = renderer.render(THOUGHT[:k], add_generation_prompt=True)  # what a server renders for that turn
        assert qwen3_like.decode(row["input_ids"][:a]) == prompt
    assert "Six sevens" not in prompt and "42." in prompt  # turn 2 read turn 1's answer without its thinking
    assert len(runs(rows[2]["loss_mask"])) == 2


def test_an_answer_a_later_user_turn_quotes_is_not_masked_in_the_quote(qwen3_like):
    """The whole-conversation search for turn 1's answer ends where turn 2's content starts, even where the
    template renders turn 1 otherwise once more follows: a user quoting the answer word for word (thinking and
    all) must not have the quote masked in place of the answer, which the template wrote without its thinking;
    the conversation becomes one sample per answer, each masked where the target wrote it."""
    quoted = [THOUGHT[0], THOUGHT[1], {"role": "user", "content": "You said:\n" + THOUGHT[1]["content"] + "\nWhy?"},
              {"role": "assistant", "content": "Because."}]
    rows, _ = tokenize(ChatRenderer(qwen3_like), [quoted], 4096)
    assert [r["turn"] for r in rows] == [1, 2]
    for row, k in zip(rows, (1, 3)):
        (a, b), = runs(row["loss_mask"])
        assert qwen3_like.decode(row["input_ids"][a:b]) == quoted[k]["content"] + "<|im_end|>"


# DeepSeek-R1's distills' rule, in a ChatML frame: every answer is rendered without its thinking, and the
# generation prompt opens the think block the target then writes into
R1_LIKE = (
    "{%- for m in messages %}{%- set content = m['content'] %}"
    "{%- if m['role'] == 'assistant' and '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}")


@pytest.mark.parametrize("stored", ["<think>\nSix sevens: 42.\n</think>\n\n42.", "Six sevens: 42.\n</think>\n\n42."])
def test_a_template_that_drops_every_answers_thinking_gives_prompt_plus_answer_samples(qwen2_tokenizer, stored):
    """R1 renders no answer as written, not even the last: its sample is the generation prompt (which opens the
    think block) + the answer as the target wrote it after that prompt + the template's end of turn; an answer
    stored with the opening tag (regenerate's reasoning_content fold) or without it gives the same sample."""
    import copy

    tok = copy.deepcopy(qwen2_tokenizer)
    tok.chat_template = R1_LIKE
    renderer = ChatRenderer(tok)
    conv = [{"role": "user", "content": "What is 6 * 7?"}, {"role": "assistant", "content": stored},
            {"role": "user", "content": "And 6 * 8?"},
            {"role": "assistant", "content": "<think>\nOne more six: 48.\n</think>\n\n48."}]
    rows, counts = tokenize(renderer, [conv], 4096)
    assert counts["bad"] == 0 and counts["per_turn"] == 1 and len(rows) == 2
    written = ("Six sevens: 42.\n</think>\n\n42.", "One more six: 48.\n</think>\n\n48.")  # after "<think>\n"
    for row, k, written in zip(rows, (1, 3), written):
        (a, b), = runs(row["loss_mask"])
        prompt = renderer.render(conv[:k], add_generation_prompt=True)
        assert tok.decode(row["input_ids"][:a]) == prompt and prompt.endswith("<|im_start|>assistant\n<think>\n")
        assert tok.decode(row["input_ids"][a:b]) == written + "<|im_end|>"
        assert tok.decode(row["input_ids"][b:]) == "\n"  # the template's end of turn, after <|im_end|>
    assert "Six sevens" not in prompt  # turn 2's prompt holds turn 1's answer as the template renders it


def test_prepare_data_and_token_counts_take_per_answer_samples(qwen3_like, tmp_path, capsys):
    import numpy as np

    from toolkit.tokenmap.count import count_tokens

    folder = tmp_path / "tok"
    qwen3_like.save_pretrained(folder)
    src = tmp_path / "t.jsonl"
    src.write_text(json.dumps({"messages": THOUGHT}) + "\n")
    out = tmp_path / "prepared"
    assert main(["prepare-data", "--tokenizer", str(folder), "--data", str(src), "--out", str(out)]) == 0
    assert "1 conversations one sample per answer" in capsys.readouterr().err
    ds = datasets.load_from_disk(str(out))
    assert ds["source"] == [f"{src}:1 turn 1", f"{src}:1 turn 2"]
    meta = json.loads((out / "toolkit_prepare.json").read_text())
    assert meta["per_turn"] == 1 and meta["kept"] == 2 and meta["bad"] == 0
    # build-token-map --assistant-only counts each answer once, thinking included
    res = count_tokens([src], ChatRenderer(qwen3_like), len(qwen3_like), mode="assistant", progress=False)
    answers = qwen3_like("".join(m["content"] + "<|im_end|>" for m in THOUGHT[1::2]), add_special_tokens=False)
    assert res.counts.sum() == sum(sum(r) for r in ds["loss_mask"])
    assert np.array_equal(np.nonzero(res.counts)[0], np.unique(answers["input_ids"]))


def test_conversations_the_template_refuses_are_said_with_its_reason(tiny_target, tmp_path, capsys):
    """A template that takes no system turn (Gemma's, Mistral's raise_exception): the reason was dropped, and with
    every conversation refused the error told the user to give assistant turns."""
    import json

    from toolkit.cli import main

    (tmp_path / "t.jinja").write_text(
        "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}"
        "{% endif %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there."}]
    system = [{"role": "system", "content": "Be brief."}] + chat
    for name, convs in (("all", [system] * 3), ("some", [system, chat, chat])):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps({"messages": c}) + "\n" for c in convs))
        rc = main(["prepare-data", "--model", str(tiny_target), "--data", str(tmp_path / f"{name}.jsonl"),
                   "--out", str(tmp_path / f"out-{name}"), "--chat-template", str(tmp_path / "t.jinja")])
        err = capsys.readouterr().err
        assert "System role not supported" in err, err
        if name == "all":
            assert rc == 2 and "3 refused, the first: the chat template refused this conversation" in err
        else:
            assert rc == 0 and "; the first refused: the chat template refused this conversation" in err


def test_several_processes_write_the_same_rows_in_the_same_order(smollm2_dir, tmp_path, capsys):
    """--num-proc (SpecForge's build-dataset-num-proc): batches rendered and tokenized in worker processes come
    back in order; the folder's rows and counts equal one process's. Bad values are refused."""
    import random

    rng = random.Random(0)
    words = "apple river moon bread chess rain list prime".split()
    convs = [{"messages": [{"role": "user", "content": " ".join(rng.choices(words, k=rng.randint(1, 30)))},
                           {"role": "assistant", "content": " ".join(rng.choices(words, k=rng.randint(1, 60)))}]}
             for _ in range(2500)]
    src = tmp_path / "many.jsonl"
    src.write_text("".join(json.dumps(c) + "\n" for c in convs) + "{broken\n" + json.dumps({"text": "x"}) + "\n")
    outs = {}
    for n in (1, 3):
        outs[n] = tmp_path / f"p{n}"
        assert main(["prepare-data", "--data", str(src), "--out", str(outs[n]), "--max-len", "48",
                     "--num-proc", str(n)]) == 0
    one, three = (datasets.load_from_disk(str(outs[n])) for n in (1, 3))
    meta = [json.loads((outs[n] / "toolkit_prepare.json").read_text()) for n in (1, 3)]
    assert len(one) == meta[0]["kept"] > 1000 and one.to_dict() == three.to_dict()
    assert {k: v for k, v in meta[0].items() if k != "data"} == {k: v for k, v in meta[1].items() if k != "data"}
    assert meta[0]["truncated"] > 0 and meta[0]["bad"] == 1
    assert "TOKENIZERS_PARALLELISM" not in capsys.readouterr().err
    assert main(["prepare-data", "--data", str(src), "--out", str(tmp_path / "x"), "--num-proc", "0"]) == 2
    assert "--num-proc 0: give a number of processes from 1 to 1024" in capsys.readouterr().err
    # every answer cut off by --max-len: said so, not "give conversations with assistant turns"
    assert main(["prepare-data", "--data", str(src), "--out", str(tmp_path / "y"), "--max-len", "3"]) == 2
    assert "--max-len 3 cut the answers off: raise it" in capsys.readouterr().err


def test_an_answer_cut_at_max_new_tokens_is_trained_without_its_end_of_turn(qwen2_tokenizer, qwen3_like):
    """`toolkit regenerate` marks an answer cut at --max-new-tokens `truncated: true`: the template still closes its
    turn, but the target never wrote that token there, so the draft is not taught to predict it; the other answers
    keep theirs. Both in a whole-conversation sample and in per-answer ones (Qwen3's thinking)."""
    from toolkit.data.schemas import to_samples

    record = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
                           {"role": "user", "content": "Count"}, {"role": "assistant", "content": "1, 2, 3,",
                                                                  "truncated": True}]}
    conv, = to_samples(record)
    rows, _ = tokenize(ChatRenderer(qwen2_tokenizer), [conv], 4096)
    row, = rows
    assert [qwen2_tokenizer.decode(row["input_ids"][a:b]) for a, b in runs(row["loss_mask"])] == [
        "Hello.<|im_end|>", "1, 2, 3,"]
    thought = [*THOUGHT[:3], {**THOUGHT[3], "truncated": True}]
    conv, = to_samples({"messages": thought})
    rows, _ = tokenize(ChatRenderer(qwen3_like), [conv], 4096)
    assert [[qwen3_like.decode(r["input_ids"][a:b]) for a, b in runs(r["loss_mask"])] for r in rows] == [
        [THOUGHT[1]["content"] + "<|im_end|>"], [THOUGHT[3]["content"]]]


def test_an_empty_last_answer_under_a_template_that_adds_text_before_it_masks_its_end_of_turn(qwen3_like):
    """Qwen3 puts an empty think block before the last answer's content: the search for an empty answer found the
    header's end, before that block, so the end-of-turn token after it (the one token the target wrote) was not
    masked. It is found where the template puts the content."""
    conv = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": ""}]
    row, = tokenize(ChatRenderer(qwen3_like), [conv], 4096)[0]
    assert [qwen3_like.decode(row["input_ids"][a:b]) for a, b in runs(row["loss_mask"])] == ["<|im_end|>"]


@pytest.mark.parametrize("answer, masked", [("think", "think<|im_end|>"), (">", "><|im_end|>")])
def test_a_short_answer_is_masked_where_the_template_puts_it_not_in_template_text_before_it(qwen3_like, answer,
                                                                                            masked):
    """The answer was searched for from the header's end: "think" and ">" were found inside Qwen3's empty think
    block, so a template token was masked and the answer's end-of-turn was not. It is found where a marker rendered
    as the content stands."""
    conv = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": answer}]
    row, = tokenize(ChatRenderer(qwen3_like), [conv], 4096)[0]
    assert [qwen3_like.decode(row["input_ids"][a:b]) for a, b in runs(row["loss_mask"])] == [masked]


def test_a_whitespace_only_answer_a_template_trims_keeps_its_end_of_turn(qwen2_tokenizer):
    """Mistral v0.3 writes "[/INST] " then the trimmed content: "   " renders as nothing, and the answer's end of
    turn (what the target wrote) is masked, where the empty answer was placed before that space and the sample
    dropped as having no assistant token; ChatML keeps the spaces, masked too."""
    import copy

    mistral_like = copy.deepcopy(qwen2_tokenizer)
    mistral_like.chat_template = ("{%- for m in messages %}{%- if m.role == 'user' %}{{ '[INST] ' + m.content + "
                                  "'[/INST]' }}{%- else %}{{ ' ' + m.content | trim + '<|im_end|>' }}{%- endif %}"
                                  "{%- endfor %}")
    for tok, want in ((mistral_like, ["<|im_end|>"]), (qwen2_tokenizer, ["   <|im_end|>"])):
        conv = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "   "}]
        rows, counts = tokenize(ChatRenderer(tok), [conv], 4096)
        assert [tok.decode(rows[0]["input_ids"][a:b]) for a, b in runs(rows[0]["loss_mask"])] == want, counts


MISTRAL_V03_LIKE = (  # Mistral-7B-Instruct-v0.3's rule: the system message goes into the last user turn, while it is last
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}"
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}{%- endif %}"
    "{%- for m in loop_messages %}{%- if m['role'] == 'user' %}"
    "{%- if loop.last and system_message is defined %}{{- '[INST] ' + system_message + '\\n\\n' + m['content'] + "
    "'[/INST]' }}{%- else %}{{- '[INST] ' + m['content'] + '[/INST]' }}{%- endif %}"
    "{%- else %}{{- ' ' + m['content'] | trim + '<|im_end|>' }}{%- endif %}{%- endfor %}")


def test_a_system_turn_the_template_shows_only_in_the_prompt_gives_one_sample_per_answer(qwen2_tokenizer):
    """Mistral v0.3 shows the system message only in a generation prompt (in the last user turn), never in a
    finished conversation: every conversation with a system turn was refused. Each answer is now a sample of the
    prompt the target read, then what the template writes before the answer (a space), the answer and its end."""
    import copy

    tok = copy.deepcopy(qwen2_tokenizer)
    tok.chat_template = MISTRAL_V03_LIKE
    conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "More"},
            {"role": "assistant", "content": "Sure, more."}]
    rows, counts = tokenize(ChatRenderer(tok), [conv], 4096)
    assert counts["bad"] == 0 and len(rows) == 2
    for row, i in zip(rows, (2, 4)):
        prompt = tok.apply_chat_template(conv[:i], tokenize=False, add_generation_prompt=True)
        assert tok.decode(row["input_ids"]) == prompt + " " + conv[i]["content"] + "<|im_end|>"
        assert [tok.decode(row["input_ids"][a:b]) for a, b in runs(row["loss_mask"])] == [
            " " + conv[i]["content"] + "<|im_end|>"]


def test_template_text_the_prompt_lacks_is_not_taken_for_a_separator(qwen3_like):
    """An answer that writes its own think block off the template's layout: Qwen3-like renders an empty think block
    before it in the finished conversation, which the generation prompt lacks; that block was taken for the
    separator before the answer (Mistral v0.3's space), giving a sample with two think blocks the target never
    read. Only whitespace is such a separator: the record is refused as before."""
    conv = [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "<think>R</think>A"}]
    rows, counts = tokenize(ChatRenderer(qwen3_like), [conv], 4096)
    assert all(qwen3_like.decode(r["input_ids"]).count("<think>") <= 1 for r in rows), rows
    assert counts["bad"] == 1 and not rows

