"""Answers whose reasoning is kept apart (`reasoning_content`: a reasoning parser's split, gpt-oss's analysis
channel) become training samples of the text the target wrote: rendered by a template that takes the field
(gpt-oss's `thinking`, Qwen3's `reasoning_content`), else folded into think tags as think-tag models write it."""
from __future__ import annotations

import copy
import json

import pytest

from test_prepare import QWEN3_LIKE, R1_LIKE, THOUGHT, runs
from toolkit.data.chat import ChatRenderer
from toolkit.data.prepare import tokenize
from toolkit.data.schemas import BadRecord, bare, to_samples
from toolkit.data.turns import Answer, Turns

HARMONY_SPECIALS = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>"]
# gpt-oss's rule, written small: a past answer is its final channel ended by <|end|>; the conversation's last
# answer, rendered for training (no generation prompt), its `thinking` as an analysis message first and <|return|>
# last; the generation prompt is <|start|>assistant, after which the target writes its channels' headers itself
HARMONY_LIKE = (
    "{{- '<|start|>system<|message|>Reasoning: ' + (reasoning_effort | default('medium')) + '<|end|>' }}"
    "{%- for m in messages %}{%- if m['role'] != 'assistant' %}"
    "{{- '<|start|>' + m['role'] + '<|message|>' + m['content'] + '<|end|>' }}"
    "{%- elif loop.last and not add_generation_prompt %}"
    "{%- if 'thinking' in m %}{{- '<|start|>assistant<|channel|>analysis<|message|>' + m['thinking'] + '<|end|>' }}"
    "{%- endif %}{{- '<|start|>assistant<|channel|>final<|message|>' + m['content'] + '<|return|>' }}"
    "{%- else %}{{- '<|start|>assistant<|channel|>final<|message|>' + m['content'] + '<|end|>' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|start|>assistant' }}{%- endif %}")
# Qwen3's own template reads `reasoning_content` (falling back to a think block in the content)
QWEN3_FIELD = QWEN3_LIKE.replace(
    "{%- if m['role'] == 'assistant' and '</think>' in content %}",
    "{%- if m['role'] == 'assistant' and m.reasoning_content is string %}"
    "{%- set reasoning = m.reasoning_content.strip('\\n') %}"
    "{%- elif m['role'] == 'assistant' and '</think>' in content %}")
APART = [{"role": "user", "content": "What is 6 * 7?"},
         {"role": "assistant", "content": "42.", "reasoning_content": "Six sevens: 42."},
         {"role": "user", "content": "And 6 * 8?"},
         {"role": "assistant", "content": "48.", "reasoning_content": "One more six: 48."}]


def with_template(tok, template: str, specials=()):
    tok = copy.deepcopy(tok)
    tok.chat_template = template
    if specials:
        tok.add_special_tokens({"additional_special_tokens": list(specials)})
    return tok


@pytest.mark.parametrize("key", ["reasoning_content", "reasoning", "thinking"])
def test_records_keep_an_answers_reasoning_under_one_name(key):
    rec = {"messages": [{"role": "user", "content": "q", key: "not an answer's"},
                        {"role": "assistant", "content": "a", key: "because"},
                        {"role": "assistant", "content": "b", key: " \n"}]}
    assert to_samples(rec) == [[{"role": "user", "content": "q"},
                                {"role": "assistant", "content": "a", "reasoning_content": "because"},
                                {"role": "assistant", "content": "b"}]]  # blank reasoning: none
    with pytest.raises(BadRecord, match="an answer's reasoning should be a string, got list"):
        to_samples({"messages": [{"role": "assistant", "content": "a", key: ["x"]}]})


def test_gpt_oss_answers_are_trained_on_their_analysis_and_channel_headers(qwen2_tokenizer):
    """Each answer is a sample of the conversation up to it; its mask covers everything the target wrote after the
    generation prompt <|start|>assistant: the analysis message, the final channel's header, the answer and the
    <|return|> that ends the turn; turn 2's prompt holds turn 1's final channel only, as a server renders it."""
    tok = with_template(qwen2_tokenizer, HARMONY_LIKE, HARMONY_SPECIALS)
    renderer = ChatRenderer(tok)
    rows, counts = tokenize(renderer, [APART], 4096)
    assert counts["bad"] == 0 and counts["per_turn"] == 1 and [r["turn"] for r in rows] == [1, 2]
    for row, k in zip(rows, (1, 3)):
        (a, b), = runs(row["loss_mask"])
        prompt = renderer.render([bare(m) for m in APART[:k]], add_generation_prompt=True)
        assert tok.decode(row["input_ids"][:a]) == prompt and prompt.endswith("<|start|>assistant")
        assert tok.decode(row["input_ids"][a:b]) == (
            f"<|channel|>analysis<|message|>{APART[k]['reasoning_content']}<|end|>"
            f"<|start|>assistant<|channel|>final<|message|>{APART[k]['content']}<|return|>")
        assert b == len(row["input_ids"])
    assert "Six sevens" not in prompt and "final<|message|>42.<|end|>" in prompt


@pytest.mark.parametrize("template", [QWEN3_FIELD, QWEN3_LIKE, R1_LIKE], ids=["qwen3-field", "qwen3-content",
                                                                             "r1-content"])
def test_reasoning_apart_trains_as_the_same_text_as_reasoning_folded_into_think_tags(qwen2_tokenizer, template):
    """A think-tag target's reasoning kept apart (what `regenerate --endpoint` writes from a reasoning parser) gives
    the rows the folded form `<think>\\n...\\n</think>\\n\\n...` gives: by the template's own field (Qwen3) or, where
    the template takes none, folded by us; the R1 rule's open think block is found in both."""
    renderer = ChatRenderer(with_template(qwen2_tokenizer, template))
    apart, apart_counts = tokenize(renderer, [APART], 4096)
    folded, folded_counts = tokenize(renderer, [THOUGHT], 4096)
    assert apart_counts["bad"] == folded_counts["bad"] == 0 and len(apart) == len(folded) == 2
    for x, y in zip(apart, folded):
        assert (x["input_ids"], x["loss_mask"]) == (y["input_ids"], y["loss_mask"])
        assert "Six sevens" in qwen2_tokenizer.decode([t for t, m in zip(x["input_ids"], x["loss_mask"]) if m]) \
            or x["turn"] == 2


def test_a_template_without_reasoning_folds_it_for_a_chatml_target(smollm2_dir):
    """SmolLM2's ChatML renders no reasoning field: the answer is trained as think-tag text before its content."""
    from toolkit.data.tokenizer import load_tokenizer

    tok = load_tokenizer(model=str(smollm2_dir))
    rows, counts = tokenize(ChatRenderer(tok), [APART[:2]], 4096)
    assert counts["bad"] == 0 and len(rows) == 1
    (a, b), = runs(rows[0]["loss_mask"])
    assert tok.decode(rows[0]["input_ids"][a:b]) == "<think>\nSix sevens: 42.\n</think>\n\n42.<|im_end|>"


def test_regenerated_turns_keep_reasoning_apart_and_do_not_ask_it_again():
    turns = Turns([{"role": "user", "content": "What is 6 * 7?"}, None, {"role": "user", "content": "And 6 * 8?"},
                   None])
    assert turns.prompt() == [{"role": "user", "content": "What is 6 * 7?"}]
    turns.answer(Answer("42.", reasoning="Six sevens: 42."))
    assert turns.prompt()[1] == {"role": "assistant", "content": "42."}  # the next turn's prompt: no reasoning
    turns.answer(Answer("48."))
    assert turns.prompt() is None and turns.conv[1]["reasoning_content"] == "Six sevens: 42."
    assert "reasoning_content" not in turns.conv[3]


def test_a_harmony_reply_splits_into_analysis_and_answer(qwen2_tokenizer):
    """In-process regeneration of a gpt-oss target: the generated tokens' analysis channel is the reasoning, the
    final channel the answer (headers dropped); a tokenizer without harmony gives all its text as the answer."""
    import torch

    from toolkit.data.harmony import reply_parts

    tok = with_template(qwen2_tokenizer, HARMONY_LIKE, HARMONY_SPECIALS)
    ids = tok("<|channel|>analysis<|message|>Six sevens.<|end|><|start|>assistant<|channel|>final<|message|>42."
              "<|return|>", add_special_tokens=False).input_ids
    assert reply_parts(tok, ids) == ("Six sevens.", "42.")
    # transformers' generate hands back a tensor (bench --compare-hf): its 0-d elements hash by identity, so the
    # special tokens to drop (the qwen2 tokenizer's <|endoftext|> here) were never found among them
    cut = tok("<|channel|>final<|message|>42.<|endoftext|>", add_special_tokens=False).input_ids
    assert reply_parts(tok, torch.tensor(cut)) == reply_parts(tok, cut) == ("", "42.")
    plain = qwen2_tokenizer("<think>\nx\n</think>\n\n42.", add_special_tokens=False).input_ids
    assert reply_parts(qwen2_tokenizer, plain) == ("", "<think>\nx\n</think>\n\n42.")


def test_prepare_data_reads_reasoning_from_a_regenerated_file(qwen2_tokenizer, tmp_path):
    """regenerate's output (`reasoning_content` beside the answer) through the CLI: one row per answer, the
    analysis in the mask."""
    import datasets

    from toolkit.cli import main

    tok = with_template(qwen2_tokenizer, HARMONY_LIKE, HARMONY_SPECIALS)
    tok.save_pretrained(tmp_path / "tok")
    src = tmp_path / "regen.jsonl"
    src.write_text(json.dumps({"id": "c:0", "source": "c:1", "messages": APART}) + "\n")
    assert main(["prepare-data", "--tokenizer", str(tmp_path / "tok"), "--data", str(src), "--out",
                 str(tmp_path / "p")]) == 0
    ds = datasets.load_from_disk(str(tmp_path / "p"))
    masked = [tok.decode([t for t, m in zip(i, lm) if m]) for i, lm in zip(ds["input_ids"], ds["loss_mask"])]
    assert ["One more six" in t for t in masked] == [False, True] and "Six sevens: 42.<|end|>" in masked[0]


def test_prepare_data_renders_with_the_template_variables_it_is_given(qwen2_tokenizer, tmp_path, capsys):
    """gpt-oss's reasoning effort is in the system message the target read: --chat-template-kwargs puts it in the
    rows as regenerate and serve had it, and toolkit_prepare.json records it; a bad value is refused by name."""
    import datasets

    from toolkit.cli import main

    tok = with_template(qwen2_tokenizer, HARMONY_LIKE, HARMONY_SPECIALS)
    tok.save_pretrained(tmp_path / "tok")
    src = tmp_path / "regen.jsonl"
    src.write_text(json.dumps({"messages": APART[:2]}) + "\n")
    base = ["prepare-data", "--tokenizer", str(tmp_path / "tok"), "--data", str(src)]
    for kwargs, effort in ((None, "medium"), ('{"reasoning_effort": "low"}', "low")):
        out = tmp_path / f"p-{effort}"
        assert main(base + ["--out", str(out)] + (["--chat-template-kwargs", kwargs] if kwargs else [])) == 0
        row = datasets.load_from_disk(str(out))[0]
        assert tok.decode(row["input_ids"]).startswith(f"<|start|>system<|message|>Reasoning: {effort}<|end|>")
        meta = json.loads((out / "toolkit_prepare.json").read_text())
        assert meta["chat_template_kwargs"] == ({"reasoning_effort": "low"} if kwargs else {})
    assert main(base + ["--out", str(tmp_path / "bad"), "--chat-template-kwargs", '{"tools": []}']) == 2
    assert "tools set how the template is applied" in capsys.readouterr().err and not (tmp_path / "bad").exists()


def test_gpt_oss_answers_without_reasoning_are_trained_as_written_too(qwen2_tokenizer):
    """A harmony template renders a past answer as the next prompt holds it (final channel, <|end|>): every gpt-oss
    conversation gives one row per answer, masked from the generation prompt on as the target wrote it (the final
    channel's header, the answer, <|return|>), not <|end|> after the answer alone; no empty analysis is made up."""
    tok = with_template(qwen2_tokenizer, HARMONY_LIKE, HARMONY_SPECIALS)
    plain = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in APART]
    rows, counts = tokenize(ChatRenderer(tok), [plain], 4096)
    assert counts["bad"] == 0 and counts["per_turn"] == 1 and len(rows) == 2
    for row, k in zip(rows, (1, 3)):
        (a, b), = runs(row["loss_mask"])
        assert tok.decode(row["input_ids"][a:b]) == f"<|channel|>final<|message|>{plain[k]['content']}<|return|>"
        assert "analysis" not in tok.decode(row["input_ids"])
    # a ChatML tokenizer's plain conversation stays one row
    assert tokenize(ChatRenderer(qwen2_tokenizer), [plain], 4096)[1]["per_turn"] == 0


@pytest.mark.parametrize("content", ["a", "final", "return", "end"])
def test_an_answer_that_is_also_a_tags_text_is_located_where_it_is_written(qwen2_tokenizer, content):
    """The answer's place comes from the template (rendered with a marker for it), not from searching the text:
    an answer "a" or "return" also occurs inside <|channel|> and <|return|>."""
    tok = with_template(qwen2_tokenizer, HARMONY_LIKE, HARMONY_SPECIALS)
    rows, _ = tokenize(ChatRenderer(tok), [[{"role": "user", "content": "Say it."},
                                            {"role": "assistant", "content": content, "reasoning_content": "a"}]], 99)
    (a, b), = runs(rows[0]["loss_mask"])
    assert tok.decode(rows[0]["input_ids"][a:b]) == (f"<|channel|>analysis<|message|>a<|end|><|start|>assistant"
                                                     f"<|channel|>final<|message|>{content}<|return|>")
