"""Chat rendering, and assistant-token masks found from the rendered template via offsets (tokenizers with their
templates: tokenizer.py).

Assistant masks need no per-model regex: for assistant message i we render messages[:i] with the
generation prompt; the full rendering starts with that prefix, so the assistant text starts right after it.
Tokens whose character offsets overlap the assistant text are masked, plus the special token that closes
the turn (<|im_end|>, <|eot_id|>, ...), which the draft must learn to predict too.
"""
from __future__ import annotations

import os

from toolkit.data.schemas import BadRecord, Conversation
from toolkit.data.tokenizer import BUILTIN_TEMPLATES, TokenizerError, special_ids

NEXT = "\u2063toolkit-next\u2063"  # a turn's content no conversation holds: where the rendering of the next begins


class TemplateRenderer:
    """A chat template compiled once and rendered with the variables apply_chat_template passes; 3x faster
    than apply_chat_template's per-call checks (a test keeps the two equal). Pickles as its source.
    Named templates (a tokenizer_config's list of {name, template}, Hermes-2-Pro's and Command-R's) are picked as
    transformers picks them: `tool_use` for a conversation with tools where there is one, else `default`."""

    def __init__(self, template: str | dict[str, str], names: dict[str, str]):
        from transformers.utils.chat_template_utils import _compile_jinja_template

        self.template, self.names = template, names
        named = template if isinstance(template, dict) else {"default": template}
        if "default" not in named:
            raise TokenizerError(f"the tokenizer's chat templates are named {', '.join(map(repr, named))} and none "
                                 "is 'default': pass --chat-template with a built-in name or a .jinja file")
        self.compiled = {name: _compile_jinja_template(source) for name, source in named.items()}

    def __call__(self, conv: Conversation, add_generation_prompt: bool = False) -> str:
        from jinja2 import TemplateError

        from toolkit.data.tools import split_tools

        conv, tools = split_tools(conv)  # a tool conversation's definitions ride on its first message
        try:
            compiled = self.compiled["tool_use" if tools and "tool_use" in self.compiled else "default"]
            return compiled.render(messages=conv, tools=tools, documents=None,
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
            # a template that renders an earlier turn differently once more follow (Qwen3's thinking) is rendered
            # with a user turn after it: the search ends where that turn's content and the next one's part
            upto = self.render(conv[:i + 1])
            if text.startswith(upto):
                bound = len(upto)
            else:
                probe = self.render(conv[:i + 1] + [{"role": "user", "content": NEXT}])
                bound = len(os.path.commonprefix([text, probe]))
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
            # where the template puts the content, found by rendering a marker there: a short answer searched for
            # from the cursor was found in template text first ("think" in Qwen3's empty think block, "\n" after
            # Gemma's end of turn); a whitespace-only one that a template trims is an empty answer there
            at = self._empty_at(conv, i, text, cursor)
            candidates = (content, content.strip())  # some templates (Llama-3) trim content: the second
            start, candidate = next(((at, c) for c in candidates if at >= 0 and text.startswith(c, at)), (-1, ""))
            for candidate in [c for c in candidates if c] if start < 0 else ():  # the marker moved: search
                start = text.find(candidate, cursor, bound)
                if start >= 0:
                    break
            if start < 0:
                raise BadRecord("the chat template rewrites assistant content; it cannot be located")
            spans.append((start, start + len(candidate)))
            cursor = start + len(candidate)
        return text, spans

    def _empty_at(self, conv, i: int, text: str, cursor: int) -> int:
        """Where answer i's content starts in `text`: found by rendering a marker as its content (Qwen3 puts an
        empty think block before it; the search for "" found the header's end, so an empty answer's end-of-turn
        token was not masked); -1 where the marked rendering does not match."""
        marked = self.render(conv[:i] + [{**conv[i], "content": NEXT}] + conv[i + 1:])
        at = marked.find(NEXT)
        return at if at >= cursor and text.startswith(marked[:at]) else -1

    def _preamble(self, msg: dict, text: str) -> str:
        """What the template renders before a reply that opens the conversation (a default system prompt, the
        assistant header), so that its content is not looked for in there; "" if `text` does not start so."""
        mark = "\u2063toolkit-reply\u2063"
        alone = self.render([{**msg, "content": mark}])
        pre = alone[:alone.find(mark)] if mark in alone else ""
        return pre if text.startswith(pre) else ""

    def assistant_mask(self, ids: list[int], offsets: list[tuple[int, int]], spans, cut=()) -> list[int]:
        """1 on tokens overlapping an assistant span and on the special token that ends that turn, unless `cut`
        (a flag per span) says the answer was cut off: the target never wrote that token there."""
        mask = [0] * len(ids)
        j = 0
        for k, (start, end) in enumerate(spans):
            while j < len(ids) and offsets[j][1] <= start:
                j += 1
            while j < len(ids) and offsets[j][0] < end:
                mask[j] = 1
                j += 1
            while j < len(ids) and offsets[j][0] == offsets[j][1] and ids[j] not in self.special:
                j += 1  # zero-width tokens between content and the end-of-turn token
            if j < len(ids) and ids[j] in self.special:
                mask[j] = 0 if k < len(cut) and cut[k] else 1
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
