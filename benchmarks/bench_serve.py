"""`toolkit serve` under load: start the real server, answer every prompt alone first (the reference), then
run rounds of N concurrent streaming clients (the `openai` package) and report per round requests/s,
generated tokens/s, τ under load (from /metrics), server RSS, and whether every answer equals its solo one.

    python benchmarks/bench_serve.py --draft /path/draft --prompts ../shared/data/eval/mt_bench.jsonl \
        --clients 32 --rounds 2 --max-tokens 64 -- --max-batch-size 16 --threads 2

Arguments after `--` go to `toolkit serve` unchanged.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time


def metric(base: str, name: str) -> float:
    import httpx

    text = httpx.get(f"{base}/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith((name + " ", name + "{")))


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def start(serve_args: list[str]) -> tuple[subprocess.Popen, str]:
    import httpx

    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "68719476736",
           "MALLOC_TOP_PAD_": "1073741824"}
    proc = subprocess.Popen([sys.executable, "-m", "toolkit.cli", "serve", "--port", "0", *serve_args],
                            stdout=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    if " on http://" not in line:
        raise SystemExit(f"server did not start: {line}")
    base = line.rsplit(" on ", 1)[1].strip().removesuffix("/v1")
    while True:
        try:
            if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            time.sleep(0.2)


def ask(client, model: str, question: str, max_tokens: int, stream: bool):
    messages = [{"role": "user", "content": question}]
    r = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=max_tokens,
                                       stream=stream, **({"stream_options": {"include_usage": True}} if stream else {}))
    if not stream:
        return r.choices[0].message.content, r.usage.completion_tokens
    text, tokens = [], 0
    for chunk in r:
        if chunk.choices:
            text.append(chunk.choices[0].delta.content or "")
        elif chunk.usage:
            tokens = chunk.usage.completion_tokens
    return "".join(text), tokens


def main() -> int:
    argv = sys.argv[1:]
    serve_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--draft", required=True)
    p.add_argument("--prompts", required=True, help="JSONL with MT-bench `turns` (first turns are asked)")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--out", default=None, help="write the JSON here too")
    args = p.parse_args(argv)

    from openai import OpenAI

    lines = [json.loads(x) for x in open(args.prompts, encoding="utf-8") if x.strip()]
    questions = [(lines[i % len(lines)].get("turns") or [lines[i % len(lines)].get("prompt", "")])[0]
                 for i in range(args.clients)]
    proc, base = start(["--draft", args.draft, *serve_args])
    report = {"clients": args.clients, "max_tokens": args.max_tokens, "serve_args": serve_args, "rounds": []}
    try:
        client = OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=3600)
        model = client.models.list().data[0].id
        t0 = time.perf_counter()
        solo = [ask(client, model, q, args.max_tokens, False) for q in questions]
        wall = time.perf_counter() - t0
        report["solo"] = {"requests_per_s": len(solo) / wall, "tokens_per_s": sum(n for _, n in solo) / wall}
        for _ in range(args.rounds):
            steps0, acc0 = metric(base, "toolkit_verify_steps_total"), metric(base, "toolkit_accepted_tokens_total")
            got: list = [None] * len(questions)

            def run(i):
                try:
                    got[i] = ask(client, model, questions[i], args.max_tokens, True)
                except Exception as e:  # counted as an error in the report
                    got[i] = e

            threads = [threading.Thread(target=run, args=(i,)) for i in range(len(questions))]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.perf_counter() - t0
            steps = metric(base, "toolkit_verify_steps_total") - steps0
            accepted = metric(base, "toolkit_accepted_tokens_total") - acc0
            ok = [g for g in got if isinstance(g, tuple)]
            report["rounds"].append({
                "wall_s": round(wall, 2), "errors": len(got) - len(ok), "requests_per_s": len(ok) / wall,
                "tokens_per_s": sum(n for _, n in ok) / wall, "tau": (accepted + steps) / steps if steps else 0.0,
                "identical_to_solo": [g[0] for g in got if isinstance(g, tuple)] == [s[0] for s in solo],
                "server_rss_mb": round(rss_mb(proc.pid), 1)})
            print(json.dumps(report["rounds"][-1]), file=sys.stderr)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
