"""OpenAI's Responses API and Anthropic's Messages API through `toolkit serve`, end to end with the `openai` and
`anthropic` clients: SmolLM2 with the shipped EAGLE-3 head answers MT-bench's two-turn questions through
`client.responses` (turn 2 by `previous_response_id`, the server holding turn 1), through anthropic's
`client.messages` and through `client.chat.completions` (turn 2 with the history sent), one request at a time,
greedy. Per API: τ and generated tokens/s; whether the texts are the same (they must be: each is the same chat
request to the engine); the Responses and Messages turns again streamed, their text deltas joined.

    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 MALLOC_TOP_PAD_=1073741824 \\
        python benchmarks/bench_responses.py [--shared ../shared] [--limit 10] [--threads 1] [--out results.json]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench_serve import start

HEAD = Path(__file__).resolve().parent / "heads" / "smollm2-135m-eagle3"


def tally(out: dict, text: str, seconds: float, tokens: int, spec: dict) -> None:
    out["texts"].append(text)
    out["seconds"] += seconds
    out["tokens"] += tokens
    out["verify_steps"] += spec["verify_steps"]
    out["accepted"] += spec["accepted_tokens"]


def by_chat(client, model: str, questions: list[dict], max_tokens: int) -> dict:
    out = {"texts": [], "seconds": 0.0, "tokens": 0, "verify_steps": 0, "accepted": 0}
    for q in questions:
        messages = []
        for turn in q["turns"]:
            messages.append({"role": "user", "content": turn})
            t0 = time.perf_counter()
            r = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=max_tokens)
            text = r.choices[0].message.content
            tally(out, text, time.perf_counter() - t0, r.usage.completion_tokens, r.usage.model_extra["speculative"])
            messages.append({"role": "assistant", "content": text})
    return out


def by_responses(client, model: str, questions: list[dict], max_tokens: int, stream: bool) -> dict:
    out = {"texts": [], "seconds": 0.0, "tokens": 0, "verify_steps": 0, "accepted": 0}
    for q in questions:
        previous = None
        for turn in q["turns"]:
            kw = dict(model=model, input=turn, temperature=0, max_output_tokens=max_tokens,
                      **({"previous_response_id": previous} if previous else {}))
            t0 = time.perf_counter()
            if stream:
                events = list(client.responses.create(**kw, stream=True))
                r = events[-1].response  # response.completed, or response.incomplete when cut at max_tokens
                text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
                assert text == r.output_text, (text, r.output_text)
            else:
                r = client.responses.create(**kw)
                text = r.output_text
            tally(out, text, time.perf_counter() - t0, r.usage.output_tokens, r.usage.model_extra["speculative"])
            previous = r.id
    return out


def by_messages(client, model: str, questions: list[dict], max_tokens: int, stream: bool) -> dict:
    out = {"texts": [], "seconds": 0.0, "tokens": 0, "verify_steps": 0, "accepted": 0}
    for q in questions:
        messages = []
        for turn in q["turns"]:
            messages.append({"role": "user", "content": turn})
            kw = dict(model=model, messages=messages, max_tokens=max_tokens, extra_body={"temperature": 0})
            t0 = time.perf_counter()
            if stream:
                with client.messages.stream(**kw) as s:
                    # the client's final message keeps only the usage fields it knows: the figures from message_delta
                    spec = next(e.usage.model_extra["speculative"] for e in s if e.type == "message_delta")
                    r = s.get_final_message()
                text = "".join(b.text for b in r.content if b.type == "text")
            else:
                r = client.messages.create(**kw)
                text, spec = r.content[0].text, r.usage.model_extra["speculative"]
            tally(out, text, time.perf_counter() - t0, r.usage.output_tokens, spec)
            messages.append({"role": "assistant", "content": text})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", default=str(Path(__file__).resolve().parents[2] / "shared"))
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from anthropic import Anthropic
    from openai import OpenAI

    lines = (Path(args.shared) / "data" / "eval" / "mt_bench.jsonl").read_text().splitlines()[:args.limit]
    questions = [json.loads(line) for line in lines]
    proc, base = start(["--draft", str(HEAD), "--num-steps", "5", "--topk", "1", "--num-draft-tokens", "6",
                        "--threads", str(args.threads), "--max-seq-len", "2048"])
    try:
        client = OpenAI(base_url=f"{base}/v1", api_key="none")
        model = client.models.list().data[0].id
        runs = {"chat": by_chat(client, model, questions, args.max_tokens),
                "responses": by_responses(client, model, questions, args.max_tokens, stream=False),
                "responses_streamed": by_responses(client, model, questions, args.max_tokens, stream=True)}
        claude = Anthropic(base_url=base, api_key="none")
        runs["messages"] = by_messages(claude, model, questions, args.max_tokens, stream=False)
        runs["messages_streamed"] = by_messages(claude, model, questions, args.max_tokens, stream=True)
    finally:
        proc.terminate()
        proc.wait()
    rows = []
    for api, r in runs.items():
        rows.append({"api": api, "turns": len(r["texts"]), "tokens": r["tokens"],
                     "tok_s": round(r["tokens"] / r["seconds"], 2),
                     "tau": round(1 + r["accepted"] / r["verify_steps"], 3) if r["verify_steps"] else None,
                     "same_texts_as_chat": r["texts"] == runs["chat"]["texts"]})
        print(json.dumps(rows[-1]), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"limit": args.limit, "max_tokens": args.max_tokens,
                                              "threads": args.threads, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
