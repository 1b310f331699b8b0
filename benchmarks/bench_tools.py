"""Tool calling through `toolkit serve`, end to end with the `openai` client: SmolLM2 with the shipped EAGLE-3
head, the built-in tool-use template (`--chat-template chatml-tools`) and `--tool-call-parser hermes`, against the
same server without speculation.

Tasks come from GPTeacher's toolformer set (../shared): the single-tool rows, the first `--per-tool` of each of
its eight tools (python, wolfram, wikipedia, search, shell, news, weather, request), each asked with all eight
offered as OpenAI function tools (one string parameter, the set's own description). Per tool_choice mode (auto,
required without parallel calls, the expected tool named), per server: how often the reply is a call, how often
it calls the tool the row was written for, whether the speculative server's calls and text equal plain
decoding's (greedy: they must), τ, and generated tokens/s; one request at a time, non-streamed (the speculative
server's then again streamed through the client's own accumulator, `chat.completions.stream`, whose merged calls
and text must equal the whole ones).

    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 MALLOC_TOP_PAD_=1073741824 \\
        python benchmarks/bench_tools.py [--shared ../shared] [--per-tool 2] [--threads 1] [--out results.json]
"""
from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

from bench_serve import start

HEAD = Path(__file__).resolve().parent / "heads" / "smollm2-135m-eagle3"
ACCESS = "toolformer access: "
MODES = {"auto": {"tool_choice": "auto"}, "required": {"tool_choice": "required", "parallel_tool_calls": False},
         "named": {}}  # named: the row's own tool


def tasks(shared: Path, per_tool: int) -> tuple[list[dict], list[dict]]:
    """(tools, tasks): the eight tools as OpenAI function tools, and per tool its first rows as {tool, prompt}."""
    rows = json.loads((shared / "data" / "train" / "gpteacher_toolformer.json").read_text())
    tools, picked = {}, []
    for row in rows:
        lines = row["instruction"].split("\n")
        if len(lines) < 5 or not lines[1].startswith(ACCESS) or "," in lines[1]:
            continue  # several tools offered: no single expected one
        name = lines[1][len(ACCESS):]
        signature = re.fullmatch(r"(\w+)\((\w+)\)", lines[3])
        if signature is None or signature[1] != name:
            continue
        tools.setdefault(name, {"type": "function", "function": {
            "name": name, "description": lines[2],
            "parameters": {"type": "object", "properties": {signature[2]: {"type": "string"}},
                           "required": [signature[2]], "additionalProperties": False}}})
        if sum(t["tool"] == name for t in picked) < per_tool:
            prompt = "\n".join(lines[4:]) + (f"\n{row['input']}" if row.get("input") else "")
            picked.append({"tool": name, "prompt": prompt})
    return list(tools.values()), sorted(picked, key=lambda t: t["tool"])


def arguments(text: str):
    """A call's arguments parsed, or the text as written when it is not JSON (a named call cut at max_tokens)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def run(base: str, tools: list[dict], work: list[dict], mode: str, max_tokens: int, stream: bool) -> dict:
    from openai import LengthFinishReasonError, OpenAI

    client = OpenAI(base_url=f"{base}/v1", api_key="none")
    out = {"calls": [], "texts": [], "tokens": 0, "verify_steps": 0, "accepted": 0, "seconds": 0.0}
    model = client.models.list().data[0].id
    for task in work:
        extra = MODES[mode] or {"tool_choice": {"type": "function", "function": {"name": task["tool"]}}}
        kw = dict(model=model, messages=[{"role": "user", "content": task["prompt"]}],
                  tools=tools, temperature=0, max_tokens=max_tokens, **extra)
        t0 = time.perf_counter()
        r = client.chat.completions.create(**kw)
        out["seconds"] += time.perf_counter() - t0
        msg = r.choices[0].message
        calls = [(c.function.name, arguments(c.function.arguments)) for c in msg.tool_calls or []]
        if stream:
            try:
                with client.chat.completions.stream(**kw) as s:  # the client's own merge of the streamed deltas
                    final = s.get_final_completion().choices[0].message
            except LengthFinishReasonError as cut:  # the helper refuses to "parse" a reply cut at max_tokens
                final = cut.completion.choices[0].message
            merged = [(c.function.name, arguments(c.function.arguments)) for c in final.tool_calls or []]
            assert merged == calls and (final.content or None) == (msg.content or None), (merged, calls)
        spec = r.usage.model_extra["speculative"]  # the server's usage extra: this request's verify steps
        out["calls"].append(calls)
        out["texts"].append(msg.content)
        out["tokens"] += r.usage.completion_tokens
        out["verify_steps"] += spec["verify_steps"]
        out["accepted"] += spec["accepted_tokens"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", default=str(Path(__file__).resolve().parents[2] / "shared"))
    ap.add_argument("--per-tool", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    tools, work = tasks(Path(args.shared), args.per_tool)
    flags = ["--chat-template", "chatml-tools", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
             "--threads", str(args.threads), "--max-seq-len", "2048"]
    servers = {"speculative": ["--draft", str(HEAD), "--num-steps", "5", "--topk", "1", "--num-draft-tokens", "6"],
               "plain": ["--draft", str(HEAD), "--no-speculation"]}
    results = {}
    for server, serve_args in servers.items():
        proc, base = start([*serve_args, *flags])
        try:
            for mode in MODES:
                results[server, mode] = run(base, tools, work, mode, args.max_tokens, server == "speculative")
        finally:
            proc.terminate()
            proc.wait()
    rows = []
    for (server, mode), r in results.items():
        plain = results["plain", mode]
        rows.append({"server": server, "mode": mode, "tasks": len(work),
                     "replies_with_calls": sum(bool(c) for c in r["calls"]),
                     "right_tool": sum(bool(c) and c[0][0] == t["tool"] for c, t in zip(r["calls"], work)),
                     "complete_arguments": sum(all(isinstance(a, dict) for _, a in c) for c in r["calls"] if c),
                     "tokens": r["tokens"], "tok_s": round(r["tokens"] / r["seconds"], 2),
                     "tau": round(1 + r["accepted"] / r["verify_steps"], 3) if r["verify_steps"] else None,
                     "same_as_plain": r["calls"] == plain["calls"] and r["texts"] == plain["texts"]})
        print(json.dumps(rows[-1]), flush=True)
    examples = [{"tool": t["tool"], "prompt": t["prompt"][:160], "required_call": c}
                for t, c in zip(work, results["speculative", "required"]["calls"])]
    if args.out:
        Path(args.out).write_text(json.dumps({"per_tool": args.per_tool, "max_tokens": args.max_tokens,
                                              "threads": args.threads, "tools": [t["function"]["name"] for t in tools],
                                              "rows": rows, "required_calls": examples}, indent=1))


if __name__ == "__main__":
    main()
