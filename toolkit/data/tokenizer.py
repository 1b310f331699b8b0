"""Tokenizers with a chat template and an EOS: from a model folder (its own template and EOS) or a bare
tokenizer.json, which has neither: then a built-in template is used (named with --chat-template, or inferred
from the tokenizer's special tokens, e.g. <|eot_id|> -> llama3), and its EOS with it. Also the checks of
--chat-template and of extra template variables (--chat-template-kwargs, a request's chat_template_kwargs).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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
