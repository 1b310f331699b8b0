import pytest

from toolkit.data.chat import ChatRenderer
from toolkit.data.tokenizer import TokenizerError, load_tokenizer

CONV = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Say hi."},
    {"role": "assistant", "content": "Hi! 👋 How can I help?"},
    {"role": "user", "content": "Add 2 and 3."},
    {"role": "assistant", "content": "2 + 3 = 5.\n\n```python\nprint(2 + 3)\n```"},
]


@pytest.mark.parametrize("name, eot", [("smollm2", "<|im_end|>"), ("llama3", "<|eot_id|>"),
                                       ("qwen2", "<|im_end|>")])
def test_masked_tokens_decode_to_exactly_the_assistant_texts(name, eot, request):
    tok = request.getfixturevalue(f"{name}_tokenizer")
    r = ChatRenderer(tok)
    text, spans = r.render_with_spans(CONV)
    assert text == tok.apply_chat_template(CONV, tokenize=False)  # the fast path renders what HF renders
    enc = tok.backend_tokenizer.encode(text, add_special_tokens=False)
    mask = r.assistant_mask(enc.ids, enc.offsets, spans)
    # each masked run is one assistant turn: its content then the end-of-turn token
    runs, cur = [], []
    for i, m in zip(enc.ids, mask):
        if m:
            cur.append(i)
        elif cur:
            runs.append(cur)
            cur = []
    runs += [cur] if cur else []
    answers = [m["content"] for m in CONV if m["role"] == "assistant"]
    assert [tok.decode(run) for run in runs] == [a + eot for a in answers]
    assert tok.convert_tokens_to_ids(eot) == tok.eos_token_id


def masked_runs(tok, conv) -> list[str]:
    r = ChatRenderer(tok)
    text, spans = r.render_with_spans(conv)
    enc = tok.backend_tokenizer.encode(text, add_special_tokens=False)
    runs, cur = [], []
    for i, m in zip(enc.ids, r.assistant_mask(enc.ids, enc.offsets, spans)):
        if m:
            cur.append(i)
        elif cur:
            runs.append(tok.decode(cur))
            cur = []
    return runs + ([tok.decode(cur)] if cur else [])


@pytest.mark.parametrize("name, eot", [("smollm2", "<|im_end|>"), ("llama3", "<|eot_id|>"),
                                       ("qwen2", "<|im_end|>")])
def test_an_answer_quoted_in_a_later_user_turn_is_masked_in_its_own_turn(name, eot, request):
    """Llama-3 trims message content, so "Blue\n" is not in its turn as written; the search must still stay in
    that turn and not land on the user's quote of it."""
    conv = [{"role": "user", "content": "Name a color."}, {"role": "assistant", "content": "Blue\n"},
            {"role": "user", "content": "You said Blue\nwhy?"}, {"role": "assistant", "content": "It is calm."}]
    runs = masked_runs(request.getfixturevalue(f"{name}_tokenizer"), conv)
    assert runs[-1] == "It is calm." + eot and len(runs) == 2
    assert runs[0].startswith("Blue") and runs[0].endswith(eot) and "why" not in runs[0]


def test_a_reply_that_opens_the_conversation_is_not_found_in_the_default_system_prompt(smollm2_tokenizer):
    """SmolLM2's template adds a system prompt naming Hugging Face: an opening reply of those words is masked
    after the assistant header, not inside that prompt."""
    conv = [{"role": "assistant", "content": "Hugging Face"}, {"role": "user", "content": "who?"},
            {"role": "assistant", "content": "me"}]
    assert masked_runs(smollm2_tokenizer, conv) == ["Hugging Face<|im_end|>", "me<|im_end|>"]


def test_builtin_template_inferred_for_bare_tokenizer_json(llama3_tokenizer, qwen2_tokenizer):
    assert llama3_tokenizer.template_name == "llama3" and llama3_tokenizer.eos_token == "<|eot_id|>"
    assert qwen2_tokenizer.template_name == "qwen2" and qwen2_tokenizer.eos_token == "<|im_end|>"
    assert ChatRenderer(llama3_tokenizer).template_special_ids() == [128000, 128006, 128007, 128009]
    assert ChatRenderer(qwen2_tokenizer).template_special_ids() == [151644, 151645]


NO_SYSTEM = ("{%- for m in messages %}{%- if m['role'] == 'system' %}{{ raise_exception('System role not "
             "supported') }}{%- endif %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] }}"
             "<|eot_id|>{%- endfor %}{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>"
             "\n\n{%- endif %}")


def test_a_template_that_refuses_a_system_turn_is_probed_without_one(shared):
    """Gemma's and Mistral v0.1's templates raise on a system turn: the special-token probe renders without one,
    and a record with a system turn is a bad record (counted), not a crash."""
    from toolkit.data.schemas import BadRecord

    tok = load_tokenizer(tokenizer=str(shared / "tokenizers/llama3/tokenizer.json"), chat_template="llama3")
    tok.chat_template = NO_SYSTEM  # the llama3 template's tokens, refusing a system turn
    renderer = ChatRenderer(tok)
    assert renderer.template_special_ids() == [128006, 128007, 128009]
    with pytest.raises(BadRecord, match="refused this conversation: System role not supported"):
        renderer.render_with_spans([{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                                    {"role": "assistant", "content": "a"}])
    text, spans = renderer.render_with_spans([{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}])
    assert [text[a:b] for a, b in spans] == ["a"]


def test_tokenizer_without_eos_or_template_is_refused(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    t = Tokenizer(models.BPE(unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.train_from_iterator(["hello world foo bar"] * 10, trainers.BpeTrainer(vocab_size=60, special_tokens=["[UNK]"]))
    t.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(TokenizerError, match="no EOS"):
        load_tokenizer(tokenizer=str(tmp_path / "tokenizer.json"))
    with pytest.raises(TokenizerError, match="not found"):
        load_tokenizer(tokenizer=str(tmp_path / "missing.json"))
    (tmp_path / "map.pt").write_bytes(b"\x80")          # an existing file of another kind was "not found"
    (tmp_path / "broken.json").write_text('{"model": ')
    for name, message in (("map.pt", "is not a .json file"), ("broken.json", "not a tokenizers JSON file")):
        with pytest.raises(TokenizerError, match=message):
            load_tokenizer(tokenizer=str(tmp_path / name))
    with pytest.raises(TokenizerError, match="llama3"):
        load_tokenizer(tokenizer=str(tmp_path / "tokenizer.json"), chat_template="vicuna")


def test_a_folder_without_a_tokenizer_and_a_file_that_is_no_template_are_refused(shared, tmp_path):
    """--tokenizer DIR without tokenizer files printed transformers' five-line error; --chat-template with a file
    that never reads `messages` (a corpus, a map) was rendered as literal text for every sample and counted."""
    (tmp_path / "empty").mkdir()
    with pytest.raises(TokenizerError, match=r"--tokenizer .*empty: no tokenizer this folder loads") as err:
        load_tokenizer(tokenizer=str(tmp_path / "empty"))
    assert "\n" not in str(err.value)
    (tmp_path / "notes.txt").write_text("hello\n")
    with pytest.raises(TokenizerError, match=r"notes\.txt: not a chat template \(it never reads `messages`\)"):
        load_tokenizer(tokenizer=str(shared / "tokenizers/qwen2/tokenizer.json"),
                       chat_template=str(tmp_path / "notes.txt"))


def test_a_template_file_over_a_bare_tokenizer_json_takes_its_familys_eos_and_bos(shared, tmp_path):
    """docs/formats.md: a bare tokenizer.json is rendered with --chat-template NAME or FILE.jinja; a file was
    always refused (a bare tokenizer.json has no EOS), and its {{ bos_token }} would have rendered empty."""
    from toolkit.data.tokenizer import BUILTIN_TEMPLATES

    (tmp_path / "mine.jinja").write_text(BUILTIN_TEMPLATES["llama3"].source)
    tok = load_tokenizer(tokenizer=str(shared / "tokenizers/llama3/tokenizer.json"),
                         chat_template=str(tmp_path / "mine.jinja"))
    assert tok.template_name == "file" and (tok.eos_token, tok.bos_token) == ("<|eot_id|>", "<|begin_of_text|>")
    text, spans = ChatRenderer(tok).render_with_spans([{"role": "user", "content": "u"},
                                                       {"role": "assistant", "content": "a"}])
    assert text.startswith("<|begin_of_text|><|start_header_id|>user") and [text[a:b] for a, b in spans] == ["a"]


def test_tools_and_documents_render_as_apply_chat_template_passes_them(shared):
    """apply_chat_template passes tools=None and documents=None; left undefined, `tools is not none` held and a
    template rendered its tool preamble into every sample (and the mask's prefix) though no tool was given."""
    tok = load_tokenizer(tokenizer=str(shared / "tokenizers/qwen2/tokenizer.json"), chat_template="chatml")
    tok.chat_template = ("{%- if tools is not none %}<|im_start|>system\nTools: {{ tools }}<|im_end|>\n{%- endif %}"
                         "{%- if documents is not none %}Documents{%- endif %}" + tok.chat_template)
    conv = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
    text, _ = ChatRenderer(tok).render_with_spans(conv)
    assert text == tok.apply_chat_template(conv, tokenize=False) == "<|im_start|>user\nu<|im_end|>\n" \
        "<|im_start|>assistant\na<|im_end|>\n"


@pytest.mark.parametrize("value, message", [
    ("{bad", "not JSON"), ("[1, 2]", "give a JSON object"), ('"x"', "give a JSON object"),
    ('{"add_generation_prompt": false}', "add_generation_prompt set how the template is applied"),
    ('{"tokenize": true, "messages": []}', "messages, tokenize set how")])
def test_template_kwargs_are_a_json_object_of_the_templates_own_variables(value, message):
    from toolkit.data.tokenizer import template_kwargs

    with pytest.raises(ValueError, match=message):
        template_kwargs(value, "--chat-template-kwargs")
    assert template_kwargs(None) == {} and template_kwargs('{"enable_thinking": false}') == {"enable_thinking": False}
    assert template_kwargs({"reasoning_effort": "low"}, "chat_template_kwargs") == {"reasoning_effort": "low"}


def test_named_chat_templates_are_picked_as_transformers_picks_them(shared, tmp_path):
    """A tokenizer_config whose chat_template is a list of named templates (Hermes-2-Pro, Command-R): `default`
    renders a conversation without tools, `tool_use` one with tools, each as apply_chat_template renders it (the
    renderer took the dict for one template and failed on every conversation); with no `default`, a clear error."""
    import json
    import shutil

    from toolkit.data.schemas import TOOLS

    plain = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    tooled = "<|im_start|>system\nTools: {{ tools | length }}<|im_end|>\n" + plain
    shutil.copy(shared / "tokenizers/qwen2/tokenizer.json", tmp_path / "tokenizer.json")
    config = {"eos_token": "<|im_end|>", "chat_template": [{"name": "default", "template": plain},
                                                           {"name": "tool_use", "template": tooled}]}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tok = load_tokenizer(tokenizer=str(tmp_path))
    assert isinstance(tok.chat_template, dict)
    conv = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    renderer = ChatRenderer(tok)
    assert renderer.render_with_spans(conv)[0] == tok.apply_chat_template(conv, tokenize=False)
    with_tools = [{**conv[0], TOOLS: tools}, conv[1]]
    text = renderer.render_with_spans(with_tools)[0]
    assert text == tok.apply_chat_template(conv, tools=tools, tokenize=False) and text.startswith("<|im_start|>system")
    config["chat_template"] = config["chat_template"][1:]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(TokenizerError, match="none is 'default'"):
        ChatRenderer(load_tokenizer(tokenizer=str(tmp_path)))
