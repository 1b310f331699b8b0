"""What structured output costs a speculative step: SmolLM2 with the shipped EAGLE-3 head answers GSM8K
questions as JSON of a schema ({"reasoning": string, "answer": integer}, compact), greedy, with no draft, a chain of
5 and a tree (4, 4, 16), constrained and not. Per setting: tokens/s, τ, whether every constrained answer parses as
JSON of the schema, whether the speculative tokens equal plain decoding's under the same constraint (they must),
and the grammar's host time per verify step (the depth-first mask walk over the tree).

    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 MALLOC_TOP_PAD_=1073741824 \\
        python benchmarks/bench_structured.py [--shared ../shared] [--questions 10] [--max-new-tokens 160] \\
            [--threads 1] [--out results.json]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from toolkit.infer.engine import Engine
from toolkit.infer.grammar import GrammarMask, Grammars
from toolkit.infer.loading import load
from toolkit.infer.loading import stop_ids as end_ids
from toolkit.infer.prompts import read_prompts
from toolkit.infer.sampling import SamplingParams
from toolkit.infer.sequence import Sequence
from toolkit.infer.tree import TreeConfig

HEAD = Path(__file__).resolve().parent / "heads" / "smollm2-135m-eagle3"
SCHEMA = {"type": "object", "properties": {"reasoning": {"type": "string", "maxLength": 400},
                                           "answer": {"type": "integer"}},
          "required": ["reasoning", "answer"], "additionalProperties": False}
TREES = {"none": None, "chain 5": TreeConfig(5, 1, 6), "tree (4, 4, 16)": TreeConfig(4, 4, 16)}


class TimedMask(GrammarMask):
    """GrammarMask that adds up the host seconds its mask walks take."""
    seconds = 0.0

    def apply(self, *args, **kw):
        t0 = time.perf_counter()
        out = super().apply(*args, **kw)
        TimedMask.seconds += time.perf_counter() - t0
        return out


def run(engine, prompts, params, stops, compiled, vocab) -> tuple[list, float]:
    t0 = time.perf_counter()
    results = []
    for p in prompts:
        grammar = None if compiled is None else TimedMask(compiled, stops, vocab)
        seq = Sequence(p, params, stops, grammar=grammar)
        engine.admit([seq])
        while engine.running:
            engine.step()
        results.append(seq.result)
    return results, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", default=str(Path(__file__).resolve().parents[2] / "shared"))
    ap.add_argument("--questions", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load(str(HEAD), None, None, "cpu", "float32")
    tok, stops = loaded.tok, frozenset(end_ids(loaded.tok, loaded.folder))
    vocab = loaded.target.config.vocab_size
    questions = read_prompts(str(Path(args.shared) / "data" / "eval" / "gsm8k.jsonl"), args.questions)
    prompts = [tok(tok.apply_chat_template(
        [{"role": "system", "content": 'Answer in JSON: {"reasoning": "...", "answer": <integer>}.'},
         {"role": "user", "content": q["turns"][0]}], tokenize=False, add_generation_prompt=True),
        add_special_tokens=False).input_ids for q in questions]
    compiled = Grammars(tok, vocab).compile("json_schema", SCHEMA, any_whitespace=False)
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    rows, plain = [], {}
    for constrained in (False, True):
        for name, tree in TREES.items():
            engine = Engine(loaded.target, loaded.head if tree else None, tree, max_len=1024)
            run(engine, prompts[:1], SamplingParams(max_new_tokens=4), stops, compiled if constrained else None,
                vocab)  # warm-up
            TimedMask.seconds = 0.0
            results, secs = run(engine, prompts, params, stops, compiled if constrained else None, vocab)
            tokens, steps = sum(len(r.tokens) for r in results), sum(r.verify_steps for r in results)
            row = {"constrained": constrained, "draft": name, "tokens": tokens, "tok_s": round(tokens / secs, 2),
                   "tau": round(sum(len(r.tokens) - 1 for r in results) / max(steps, 1), 3),
                   "mask_ms_per_step": round(1e3 * TimedMask.seconds / max(steps, 1), 3) if constrained else None}
            if tree is None:
                plain[constrained] = [r.tokens for r in results]
            row["same_tokens_as_plain"] = [r.tokens for r in results] == plain[constrained]
            if constrained:
                parsed = 0
                for r in results:
                    try:
                        value = json.loads(tok.decode(r.tokens, skip_special_tokens=True))
                        parsed += isinstance(value.get("answer"), int)
                    except ValueError:
                        pass
                row["valid_json"] = f"{parsed}/{len(results)}"
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"questions": args.questions, "max_new_tokens": args.max_new_tokens,
                                              "threads": args.threads, "schema": SCHEMA, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
