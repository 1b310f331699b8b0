"""`toolkit regenerate` without --endpoint: the target's answers from our engine, in-process, with continuous
batching over conversations: a conversation's next turn joins the running batch as soon as its last answer is
in, and a new conversation as soon as a row is free, so no row waits for the longest answer of a group."""
from __future__ import annotations

from collections import deque
from typing import Iterator

from toolkit.data.tools import split_tools
from toolkit.data.harmony import is_harmony, reply_parts
from toolkit.data.turns import Answer, Turns


def engine_runner(args):
    """-> run(todo) yielding ((id, source, skeleton), (conversation, Outcome)) as conversations finish."""
    from jinja2 import TemplateError

    from toolkit.infer.engine import Engine
    from toolkit.infer.loading import load, stop_ids
    from toolkit.infer.sampling import SamplingParams, seeded_generator
    from toolkit.infer.sequence import Sequence

    loaded = load(None, args.model, None, args.device, args.dtype, chat_template=args.chat_template)
    tok, target = loaded.tok, loaded.target
    max_len = min(args.max_len, target.config.max_position_embeddings)
    engine = Engine(target, None, None, max_len, max_batch=args.batch_size)
    params = SamplingParams(args.temperature, 1.0 if args.top_p is None else args.top_p, 0, args.max_new_tokens)
    gen = seeded_generator(engine.device, args.seed or 0)  # the target's device: CUDA sampling refuses a CPU one
    stop = frozenset(stop_ids(tok, loaded.folder))
    harmony = is_harmony(tok)  # gpt-oss: the channels kept as written (its template renders them verbatim)

    def encode(messages: list[dict]) -> list[int] | Answer:
        try:
            messages, tools = split_tools(messages)  # a tool conversation's definitions, for the template
            text = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True,
                                           **args.variables)
        except TemplateError as e:  # e.g. a template that takes no system turn (Gemma): this conversation only
            return Answer(error=f"the chat template refused it: {e}")
        ids = tok(text, add_special_tokens=False).input_ids
        return ids if len(ids) + args.max_new_tokens <= max_len else Answer(too_long=True)

    def answered(seq: Sequence) -> Answer:
        reasoning, text = reply_parts(tok, seq.result.tokens)  # gpt-oss (harmony): analysis apart from the answer
        cut = seq.result.finish == "length"
        if not text.strip():
            return Answer(cut=cut, error="no answer after the reasoning (it used up --max-new-tokens)"
                          if reasoning.strip() else "an empty answer")
        return Answer(text if harmony else text.strip(), reasoning=reasoning, cut=cut)

    def run(todo: list) -> Iterator:
        items, ready, live, more = iter(todo), deque(), {}, True
        while True:
            admit = []
            while len(engine.running) + len(admit) < engine.max_batch and (ready or more):
                if ready:
                    item, turns = ready.popleft()
                else:
                    item = next(items, None)
                    if item is None:
                        more = False
                        continue
                    turns = Turns(item[2], args.on_length)
                while (messages := turns.prompt()) is not None and isinstance(ids := encode(messages), Answer):
                    turns.answer(ids)  # no prompt to ask: the conversation ends here
                if messages is None:
                    yield item, (turns.conv, turns.outcome)
                    continue
                seq = Sequence(ids, params, stop, None, gen)
                live[id(seq)] = (item, turns)
                admit.append(seq)
            if not admit and not engine.running:
                return
            finished = []
            if admit:
                admit.sort(key=lambda q: len(q.prompt))  # neighbours of similar length prefill together
                engine.admit(admit)
                finished += [q for q in admit if q.done]  # stopped at their first token
            if engine.running:
                finished += [q for q in engine.step() if q.done]
            for q in finished:
                item, turns = live.pop(id(q))
                turns.answer(answered(q))
                ready.append((item, turns))

    return run
