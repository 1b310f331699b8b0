"""The training samples of one conversation: the text the target read, and the spans of what it wrote.

Most templates render a finished conversation with every answer as written: one sample, every answer's span.
Some rewrite answers once more follows, or always:
- Qwen3 drops an earlier answer's `<think>` block once another user turn follows: each answer then becomes a
  sample of the conversation up to it (what a server renders as that turn's prompt, earlier answers without
  their thinking), with that answer, thinking included, as its span;
- DeepSeek-R1's distills drop the thinking of every answer, the last one too, and open the think block in the
  generation prompt: such an answer's sample is that prompt + the answer as written (less what the prompt already
  opened) + the template's end of turn, which is the text the target read and wrote.
An answer whose reasoning is kept apart (`reasoning_content`: a reasoning parser's split, gpt-oss's analysis
channel) is rendered by the template where it takes one (Qwen3's `reasoning_content`, gpt-oss's `thinking`, which
it renders for a conversation's last answer only): its sample is the conversation up to it, the span all the target
wrote after the generation prompt up to the content's end (gpt-oss: the analysis message, the final channel's
header, the answer). A template that takes none renders it as think-tag models write it, `<think>\n{reasoning}
\n</think>\n\n{content}`, through the rules above. Conversations with such answers give one sample per answer,
and so does every conversation of a harmony tokenizer (gpt-oss), reasoning or not: its template renders a past
answer as the prompt holds it (`<|end|>`), not as the target wrote it (its channel's header, `<|return|>`).
"""
from __future__ import annotations

from toolkit.data.schemas import REASONING, BadRecord, bare, template_reasoning

MARK = "\u2063toolkit-answer\u2063"  # an answer the template cannot rewrite: where its end of turn begins


def training_samples(renderer, conv: list[dict]) -> list[tuple[str, list[tuple[int, int]]]]:
    """[(text, [(start, end) of each answer span])] for `conv` (see the module docstring)."""
    if renderer.harmony or any(REASONING in m for m in conv):
        return [written_sample(renderer, conv[:i + 1]) if REASONING in m or renderer.harmony else
                answer_sample(renderer, [bare(m) for m in conv[:i + 1]])
                for i, m in enumerate(conv) if m["role"] == "assistant"]
    try:
        return [renderer.render_with_spans(conv)]
    except BadRecord:
        pass
    return [answer_sample(renderer, conv[:i + 1]) for i, m in enumerate(conv) if m["role"] == "assistant"]


def answer_sample(renderer, conv: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    """The sample of the last answer of `conv`: rendered with it, or else built around the template's prompt."""
    try:
        return renderer.render_with_spans(conv, last_only=True)
    except BadRecord as rewritten:
        prompt = renderer.render(conv[:-1], add_generation_prompt=True)
        marked = renderer.render(conv[:-1] + [{**conv[-1], "content": MARK}])
        at = marked.find(MARK)
        gap = "" if at >= 0 and prompt.startswith(marked[:at]) else _gap(prompt, marked[:at], conv) if at >= 0 else None
        if gap is None:  # the answer does not follow the prompt's header
            raise rewritten
        answer = conv[-1]["content"]
        opened = prompt[at:] if not gap else ""  # what the generation prompt adds after the answer's header (R1:
        if opened and answer.startswith(opened):  # "<think>\n")
            answer = answer[len(opened):]
        end = marked[at + len(MARK):]  # the template's end of turn
        start = len(prompt) + len(gap)
        return prompt + gap + answer + end, [(start, start + len(answer))]


def _gap(prompt: str, head: str, conv: list[dict]) -> str | None:
    """What the template writes between the generation prompt's end and the answer where the prompt renders the
    history otherwise than the finished conversation does (Mistral v0.3 puts the system message into the last user
    turn only while that turn is last): the shortest tail of `head` (the finished rendering up to the answer) whose
    removal leaves it ending as the prompt ends, from the last user turn's content on, when it is whitespace (a
    separator, Mistral's space); None otherwise."""
    user = next((m["content"] for m in reversed(conv) if m["role"] == "user"), None)
    if not isinstance(user, str) or not user:
        return None
    for cut in range(min(len(head), 64) + 1):  # a separator is a few characters
        rest = head[:len(head) - cut]
        same = next((n for n in range(min(len(rest), len(prompt))) if rest[-1 - n] != prompt[-1 - n]),
                    min(len(rest), len(prompt)))  # the common tail's length
        if same and user in prompt[len(prompt) - same:]:
            gap = head[len(head) - cut:]  # text the prompt lacks (Qwen3's empty think block before an answer
            return gap if not gap.strip() else None  # that opens its own) is no separator
    return None


def written_sample(renderer, conv: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    """The sample of the last answer of `conv` as the target wrote it after the generation prompt, its reasoning
    (kept apart) included (see the module docstring)."""
    past, last = [bare(m) for m in conv[:-1]], conv[-1]
    thought, content = last.get(REASONING, ""), last["content"]
    prompt = renderer.render(past, add_generation_prompt=True)
    shown = template_reasoning(last, thought)
    text = renderer.render(past + [shown])
    at = renderer.render(past + [{**shown, "content": MARK}]).find(MARK)  # where the content starts
    if text.startswith(prompt) and at >= len(prompt) and thought.strip() in text[len(prompt):at]:
        for candidate in (content, content.strip()):  # some templates (Llama-3) trim message content
            if candidate and text.startswith(candidate, at):
                return text, [(len(prompt), at + len(candidate))]
    if not thought:  # nothing to fold in
        return answer_sample(renderer, past + [bare(last)])
    folded = f"<think>\n{thought.strip(chr(10))}\n</think>\n\n{content.lstrip(chr(10))}"
    return answer_sample(renderer, past + [{**bare(last), "content": folded}])
