"""Tokenizers, chat rendering, and assistant-token masks found from the rendered template via offsets.

A tokenizer comes from a model folder (its own chat template and EOS) or a bare tokenizer.json, which has
neither: then a built-in template is used (named with --chat-template, or inferred from the tokenizer's
special tokens, e.g. <|eot_id|> -> llama3), and its EOS with it.

Assistant masks need no per-model regex: for assistant message i we render messages[:i] with the
generation prompt; the full rendering starts with that prefix, so the assistant text starts right after it.
Tokens whose character offsets overlap the assistant text are masked, plus the special token that closes
the turn (<|im_end|>, <|eot_id|>, ...), which the draft must learn to predict too.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from toolkit.data.schemas import BadRecord, Conversation

TEMPLATES_DIR = Path(__file__).parent / "templates"


@dataclass(frozen=True)
class BuiltinTemplate:
    name: str
    eos: str  # end of turn = end of generation for chat
    bos: str | None
    markers: tuple[str, ...]  # special tokens whose presence in a vocabulary implies this template

    @property
    def source(self) -> str:
        return (TEMPLATES_DIR / f"{self.name}.jinja").read_text().strip()


BUILTIN_TEMPLATES = {t.name: t for t in (
    BuiltinTemplate("llama3", "<|eot_id|>", "<|begin_of_text|>", ("<|start_header_id|>", "<|eot_id|>")),
    BuiltinTemplate("qwen2", "<|im_end|>", None, ("<|im_start|>", "<|im_end|>", "<|endoftext|>")),
    BuiltinTemplate("chatml", "<|im_end|>", None, ("<|im_start|>", "<|im_end|>")),
    BuiltinTemplate("chatml-tools", "<|im_end|>", None, ()),  # tools as Hermes / Qwen2.5 write them; named only
)}


class TokenizerError(ValueError):
    """A tokenizer we cannot use as asked; the message says what was wrong and what is accepted."""


# apply_chat_template's own arguments and the variables it sets: never a template variable a caller may override
RESERVED_TEMPLATE_ARGS = frozenset({
    "messages", "conversation", "tools", "documents", "add_generation_prompt", "continue_final_message",
    "tokenize", "chat_template", "return_dict", "return_tensors", "padding", "truncation", "max_length",
    "tokenizer_kwargs", "return_assistant_tokens_mask"})


def check_template_name(value: str | None) -> None:
    """A --chat-template that is neither a built-in name nor a file is refused before minutes of loading."""
    if value is not None and value not in BUILTIN_TEMPLATES and not Path(value).is_file():
        raise ValueError(f"--chat-template {value}: not a file and not one of the built-in templates "
                         f"{', '.join(BUILTIN_TEMPLATES)}")


def template_kwargs(value, flag: str = "--chat-template-kwargs") -> dict:
    """Extra chat-template variables, as vLLM's and SGLang's `chat_template_kwargs` (e.g. Qwen3's
    {"enable_thinking": false}); `value` is a JSON text (a command-line flag), a dict (a request) or None."""
    if value is None:
        return {}
    if isinstance(value, str):
        import json

        try:
            value = json.loads(value)
        except ValueError as e:
            raise ValueError(f"{flag} {value!r}: not JSON ({e}); give an object, e.g. "
                             '\'{"enable_thinking": false}\'') from None
    if not isinstance(value, dict):
        raise ValueError(f"{flag}: give a JSON object of template variables, e.g. {{\"enable_thinking\": false}}; "
                         f"got {type(value).__name__}")
    reserved = sorted(RESERVED_TEMPLATE_ARGS & value.keys())
    if reserved:
        raise ValueError(f"{flag}: {', '.join(reserved)} set how the template is applied, not a variable it reads; "
                         "give the template's own variables only (e.g. enable_thinking)")
    return value


def load_tokenizer(model: str | None = None, tokenizer: str | None = None, chat_template: str | None = None):
    """A transformers fast tokenizer with a chat template and an EOS token, or a clear TokenizerError.

    `tokenizer` (a folder or a tokenizer.json) wins over `model` (folder / hub id / alias, default: the
    embedded SmolLM2). `chat_template` is a built-in name or a .jinja file and overrides the tokenizer's.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if tokenizer is not None:
        path = Path(tokenizer).expanduser()
        if path.is_file() and path.suffix == ".json":
            try:
                tok = PreTrainedTokenizerFast(tokenizer_file=str(path))
            except Exception as e:  # the tokenizers library's parse errors
                raise TokenizerError(f"--tokenizer {tokenizer}: not a tokenizers JSON file "
                                     f"({str(e).splitlines()[0][:120]})") from None
        elif path.is_dir():
            try:
                tok = AutoTokenizer.from_pretrained(path)
            except (OSError, ValueError) as e:  # no tokenizer files: transformers' message runs over 5 lines
                raise TokenizerError(f"--tokenizer {tokenizer}: no tokenizer this folder loads ({type(e).__name__}); "
                                     "give a tokenizer.json file or a folder with tokenizer.json / "
                                     "tokenizer_config.json") from None
        else:
            what = "is not a .json file" if path.is_file() else "not found"
            raise TokenizerError(f"--tokenizer {tokenizer}: {what}; give a tokenizer.json file or a folder "
                                 f"with tokenizer files")
        tok.name_or_path = str(path)
    else:
        from toolkit.models import resolve_target

        folder = resolve_target(model)
        tok = AutoTokenizer.from_pretrained(folder)
        tok.name_or_path = model or folder.name
    if not getattr(tok, "is_fast", False):
        raise TokenizerError(f"{tok.name_or_path}: a fast (Rust `tokenizers`) tokenizer is needed for offsets")
    # a tokenizer.json saved after a training run may keep its truncation / padding; every text here is
    # encoded whole and unpadded (token counting calls the Rust tokenizer directly, which would apply them)
    tok.backend_tokenizer.no_truncation()
    tok.backend_tokenizer.no_padding()
    builtin = None
    if chat_template is not None:
        if chat_template in BUILTIN_TEMPLATES:
            builtin = BUILTIN_TEMPLATES[chat_template]
            tok.chat_template = builtin.source
        elif Path(chat_template).is_file():
            try:
                tok.chat_template = Path(chat_template).read_text(encoding="utf-8")
            except UnicodeDecodeError as e:
                raise TokenizerError(f"--chat-template {chat_template}: not UTF-8 text ({e.reason} at byte "
                                     f"{e.start}); give a .jinja file") from None
            if "messages" not in tok.chat_template:  # a tokenizer.json, a corpus: rendered as literal text
                raise TokenizerError(f"--chat-template {chat_template}: not a chat template (it never reads "
                                     f"`messages`); give a .jinja file or one of {sorted(BUILTIN_TEMPLATES)}")
        else:
            raise TokenizerError(f"--chat-template {chat_template}: not a file and not one of the built-in "
                                 f"templates {sorted(BUILTIN_TEMPLATES)}")
    elif not tok.chat_template:
        builtin = infer_template(tok)
        if builtin is not None:
            tok.chat_template = builtin.source
    # a .jinja file over a bare tokenizer.json (no EOS, no BOS): those of the built-in template of its family
    family = builtin or (infer_template(tok) if chat_template is not None else None)
    if family is not None:
        if tok.eos_token is None:
            tok.eos_token = family.eos
        if tok.bos_token is None and family.bos is not None:
            tok.bos_token = family.bos
    tok.template_name = builtin.name if builtin else ("file" if chat_template else "tokenizer")
    if isinstance(tok.chat_template, str):  # a syntax error found now, not at the first conversation's render
        from jinja2 import TemplateSyntaxError
        from transformers.utils.chat_template_utils import _compile_jinja_template

        try:
            _compile_jinja_template(tok.chat_template)
        except TemplateSyntaxError as e:
            source = f"--chat-template {chat_template}" if chat_template else f"{tok.name_or_path}'s chat template"
            raise TokenizerError(f"{source}: a Jinja syntax error at line {e.lineno}: {e.message}") from None
    if tok.eos_token_id is None:
        raise TokenizerError(f"{tok.name_or_path}: the tokenizer has no EOS token; give a model folder whose "
                             f"tokenizer_config.json names one, or --chat-template "
                             f"{'|'.join(BUILTIN_TEMPLATES)} to take the template's")
    return tok


def infer_template(tok) -> BuiltinTemplate | None:
    vocab = tok.get_vocab()
    for t in BUILTIN_TEMPLATES.values():  # most specific first; one without markers is never inferred
        if t.markers and all(m in vocab for m in t.markers):
            return t
    return None


def special_ids(tok) -> set[int]:
    ids = set(tok.all_special_ids)
    ids.update(i for i, t in tok.added_tokens_decoder.items() if t.special)
    return ids


class TemplateRenderer:
    """A chat template compiled once and rendered with the variables apply_chat_template passes; 3x faster
    than apply_chat_template's per-call checks (a test keeps the two equal). Pickles as its source."""

    def __init__(self, template: str, names: dict[str, str]):
        from transformers.utils.chat_template_utils import _compile_jinja_template

        self.template, self.names = template, names
        self.compiled = _compile_jinja_template(template)

    def __call__(self, conv: Conversation, add_generation_prompt: bool = False) -> str:
        from jinja2 import TemplateError

        from toolkit.data.tools import split_tools

        conv, tools = split_tools(conv)  # a tool conversation's definitions ride on its first message
        try:
            return self.compiled.render(messages=conv, tools=tools, documents=None,
                                        add_generation_prompt=add_generation_prompt, **self.names)
        except TemplateError as e:  # raise_exception(...) in the template: e.g. no system turn (Gemma, Mistral)
            raise BadRecord(f"the chat template refused this conversation: {e}") from None

    def __getstate__(self):
        return {"template": self.template, "names": self.names}

    def __setstate__(self, state):
        self.__init__(state["template"], state["names"])


class ChatRenderer:
    """Renders conversations with a tokenizer's chat template and finds assistant character spans."""

    def __init__(self, tok, variables: dict | None = None):
        """`variables`: extra template variables (template_kwargs), as the target was served with them."""
        if not tok.chat_template:
            raise TokenizerError(f"{tok.name_or_path}: the tokenizer has no chat template; pass "
                                 f"--chat-template {'|'.join(BUILTIN_TEMPLATES)} or a .jinja file")
        from toolkit.data.harmony import is_harmony

        self.tok = tok
        self.special = special_ids(tok)
        self.special_texts = sorted((t for t in tok.convert_ids_to_tokens(sorted(self.special)) if t), key=len,
                                    reverse=True)  # longest first: a token that ends another is not taken for it
        self.harmony = is_harmony(tok)  # gpt-oss: each answer a sample of what the target wrote (samples.py)
        self.render = TemplateRenderer(tok.chat_template, {**tok.special_tokens_map, **(variables or {})})

    def render_samples(self, conv: Conversation) -> list[tuple[str, list[tuple[int, int]]]]:
        """The training samples of a conversation, each (text, assistant spans): the whole conversation, or one
        per answer where the template rewrites answers (Qwen3's and DeepSeek-R1's thinking; toolkit/data/samples.py)."""
        from toolkit.data.samples import training_samples

        return training_samples(self, conv)

    def render_with_spans(self, conv: Conversation, last_only: bool = False) -> tuple[str, list[tuple[int, int]]]:
        """Full text and the [start, end) character span of every assistant message's content in it (of the last
        one only with `last_only`)."""
        text = self.render(conv)
        spans, cursor = [], 0
        last = max(i for i, m in enumerate(conv) if m["role"] == "assistant") if last_only else -1
        for i, msg in enumerate(conv):
            if msg["role"] != "assistant" or i < last:
                continue
            prefix = self.render(conv[:i], add_generation_prompt=True) if i else self._preamble(msg, text)
            if not text.startswith(prefix):
                raise BadRecord("the chat template renders a conversation's prefix differently from the "
                                "whole; assistant tokens cannot be located")
            cursor = max(cursor, len(prefix))
            # the search ends with this turn, so an answer also quoted later (a user turn) is not found there;
            # templates that render earlier turns differently once more follow (Qwen3's thinking) search on
            upto = self.render(conv[:i + 1])
            bound = len(upto) if text.startswith(upto) else len(text)
            if msg.get("tool_calls"):  # the calls as the template writes them: the whole turn is the target's
                if not text.startswith(upto) or len(upto.rstrip()) <= cursor:
                    raise BadRecord("the chat template renders a tool-calling turn differently once more follows; "
                                    "its tokens cannot be located")
                end = len(upto.rstrip())
                closing = next((t for t in self.special_texts if upto.rstrip().endswith(t)), "")
                # up to its end-of-turn token, which assistant_mask adds as it does after an answer (not the next
                # turn's header that follows it at once in Llama-3's template)
                spans.append((cursor, end - len(closing)))
                cursor = end
                continue
            content = msg["content"]
            for candidate in (content, content.strip()):  # some templates (Llama-3) trim message content
                start = text.find(candidate, cursor, bound)
                if start >= 0:
                    break
            else:
                raise BadRecord("the chat template rewrites assistant content; it cannot be located")
            spans.append((start, start + len(candidate)))
            cursor = start + len(candidate)
        return text, spans

    def _preamble(self, msg: dict, text: str) -> str:
        """What the template renders before a reply that opens the conversation (a default system prompt, the
        assistant header), so that its content is not looked for in there; "" if `text` does not start so."""
        mark = "\u2063toolkit-reply\u2063"
        alone = self.render([{**msg, "content": mark}])
        pre = alone[:alone.find(mark)] if mark in alone else ""
        return pre if text.startswith(pre) else ""

    def assistant_mask(self, ids: list[int], offsets: list[tuple[int, int]], spans) -> list[int]:
        """1 on tokens overlapping an assistant span and on the special token that ends that turn."""
        mask = [0] * len(ids)
        j = 0
        for start, end in spans:
            while j < len(ids) and offsets[j][1] <= start:
                j += 1
            while j < len(ids) and offsets[j][0] < end:
                mask[j] = 1
                j += 1
            while j < len(ids) and offsets[j][0] == offsets[j][1] and ids[j] not in self.special:
                j += 1  # zero-width tokens between content and the end-of-turn token
            if j < len(ids) and ids[j] in self.special:
                mask[j] = 1
                j += 1
        return mask

    def template_special_ids(self) -> list[int]:
        """EOS plus every special token the template emits around a turn (always kept in token maps). Probed
        with a system turn and without one: some templates refuse a system turn (Gemma, Mistral v0.1)."""
        system, user, assistant = ({"role": r, "content": r[0]} for r in ("system", "user", "assistant"))
        found, rendered, refusals = {self.tok.eos_token_id}, 0, []
        for conv in ([system, user, assistant], [user, assistant]):
            for turns, prompt in ((conv, False), (conv[:-1], True)):
                try:
                    text = self.render(turns, add_generation_prompt=prompt)
                except BadRecord as e:
                    refusals.append(str(e))
                    continue
                rendered += 1
                found.update(i for i in self.tok(text, add_special_tokens=False)["input_ids"] if i in self.special)
        if not rendered:
            raise TokenizerError(f"{self.tok.name_or_path}: the chat template renders no user / assistant "
                                 f"exchange ({refusals[-1]}); pass --chat-template")
        return sorted(i for i in found if i is not None)
