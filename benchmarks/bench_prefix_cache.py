"""The prefix cache through `toolkit serve`, end to end: SmolLM2 with the shipped EAGLE-3 head, one streamed chat
request at a time, greedy, on a server with `--prefix-cache-rows 4` and on one with `--prefix-cache-rows 0`.

  multi-turn   MT-bench's two-turn questions, turn 2 re-sending turn 1 and its answer (as every chat client does)
  shared       one long system prompt (4,000 characters of the README's CLI section, ~1k tokens, as an agent's tool
               list would be)
               before each of the questions' first turns

Per server and workload: time to first token (the prefill, mostly) by turn, total seconds, generated tokens/s,
the prompt tokens the cache held (usage.prompt_tokens_details.cached_tokens), τ, and whether the texts are the
same with the cache as without (they must be, greedy).

    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 MALLOC_TOP_PAD_=1073741824 \\
        python benchmarks/bench_prefix_cache.py [--shared ../shared] [--limit 10] [--threads 1] [--out results.json]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench_serve import start

HEAD = Path(__file__).resolve().parent / "heads" / "smollm2-135m-eagle3"
README = Path(__file__).resolve().parents[1] / "README.md"


def streamed(client, model: str, messages: list[dict], max_tokens: int) -> dict:
    """One streamed chat request: its text, time to first token, seconds, usage."""
    t0, first, parts, usage = time.perf_counter(), None, [], None
    for chunk in client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=max_tokens,
                                                stream=True, stream_options={"include_usage": True}):
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter() - t0
            parts.append(chunk.choices[0].delta.content)
        usage = chunk.usage or usage
    return {"text": "".join(parts), "ttft": first or 0.0, "seconds": time.perf_counter() - t0, "usage": usage}


def workload(client, model: str, questions: list[dict], kind: str, system: str, max_tokens: int) -> list[dict]:
    replies = []
    for q in questions:
        messages = [{"role": "system", "content": system}] if kind == "shared" else []
        for turn in q["turns"][:2 if kind == "multi-turn" else 1]:
            messages.append({"role": "user", "content": turn})
            r = streamed(client, model, messages, max_tokens)
            replies.append({**r, "turn": sum(m["role"] == "user" for m in messages)})
            messages.append({"role": "assistant", "content": r["text"]})
    return replies


def summary(replies: list[dict]) -> dict:
    u = [r["usage"] for r in replies]
    spec = [x.model_extra["speculative"] for x in u]
    steps = sum(s["verify_steps"] for s in spec)
    out = {"requests": len(replies), "prompt_tokens": sum(x.prompt_tokens for x in u),
           "cached_tokens": sum(x.prompt_tokens_details.cached_tokens for x in u),
           "tokens": sum(x.completion_tokens for x in u), "seconds": round(sum(r["seconds"] for r in replies), 2),
           "tau": round(1 + sum(s["accepted_tokens"] for s in spec) / steps, 3) if steps else None}
    out["tok_s"] = round(out["tokens"] / out["seconds"], 2)
    for turn in sorted({r["turn"] for r in replies}):
        ttft = [r["ttft"] for r in replies if r["turn"] == turn]
        out[f"ttft_turn{turn}_mean_s"] = round(sum(ttft) / len(ttft), 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", default=str(Path(__file__).resolve().parents[2] / "shared"))
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from openai import OpenAI

    lines = (Path(args.shared) / "data" / "eval" / "mt_bench.jsonl").read_text().splitlines()[:args.limit]
    questions = [json.loads(line) for line in lines]
    text = README.read_text()
    system = text[text.index("## The CLI"):][:4000]
    rows, texts = [], {}
    for rows_kept in (4, 0):
        proc, base = start(["--draft", str(HEAD), "--num-steps", "5", "--topk", "1", "--num-draft-tokens", "6",
                            "--threads", str(args.threads), "--max-seq-len", "2048",
                            "--prefix-cache-rows", str(rows_kept)])
        try:
            client = OpenAI(base_url=f"{base}/v1", api_key="none")
            model = client.models.list().data[0].id
            for kind in ("multi-turn", "shared"):
                replies = workload(client, model, questions, kind, system, args.max_tokens)
                texts[rows_kept, kind] = [r["text"] for r in replies]
                rows.append({"prefix_cache_rows": rows_kept, "workload": kind, **summary(replies)})
                print(json.dumps(rows[-1]), flush=True)
        finally:
            proc.terminate()
            proc.wait()
    for row in rows:
        row["same_texts_as_without"] = texts[row["prefix_cache_rows"], row["workload"]] == texts[0, row["workload"]]
    print(json.dumps([(r["workload"], r["prefix_cache_rows"], r["same_texts_as_without"]) for r in rows]))
    if args.out:
        Path(args.out).write_text(json.dumps({"limit": args.limit, "max_tokens": args.max_tokens,
                                              "threads": args.threads, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
