"""Answer a batch file with the speculative engine in this process, no server: OpenAI's batch input format (as
`vllm run-batch` reads it: chat, completions, responses and messages requests) or Anthropic's Message Batches
requests, one per line; the output file holds one answer per line in the input's order.

    toolkit run-batch -i requests.jsonl -o results.jsonl --draft ./ckpt [--max-batch-size 16] [--num-steps 5 ...]

Requests run through the same API code as `toolkit serve` (continuous batching, the same checks, usage with the
speculation figures); the file is checked whole before the model loads, and the output is written to a temp file
renamed at the end (never half a file). Formats: docs/formats.md, "Batch files".
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from toolkit.serve import engine_args
from toolkit.serve.batch_file import BatchLine, read_batch


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-i", "--input-file", required=True, help="batch file: one request per line (OpenAI's "
                   "{custom_id, method, url, body} or Anthropic's {custom_id, params})")
    p.add_argument("-o", "--output-file", required=True, help="where the answers go, one line per request")
    p.add_argument("--max-concurrency", type=int, default=None, metavar="N",
                   help="requests in flight at once (default: twice --max-batch-size, so the batch stays full)")
    engine_args.add_args(p)


@dataclass
class Tally:
    """What the answers add up to, read from their usage."""
    ok: int = 0
    failed: dict = field(default_factory=dict)  # status (or "error") -> count
    first_failure: str | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    verify_steps: int = 0
    accepted: int = 0

    def add(self, line: BatchLine, status: int | None, body) -> None:
        if status != 200:
            self.failed[status or "error"] = self.failed.get(status or "error", 0) + 1
            if self.first_failure is None:
                error = body.get("error", body) if isinstance(body, dict) else body
                message = error.get("message", error) if isinstance(error, dict) else error
                self.first_failure = f"line {line.line} ({line.custom_id}): {status or 'no answer'} {message}"
            return
        self.ok += 1
        usage = body.get("usage") or {}
        self.prompt_tokens += usage.get("prompt_tokens", usage.get("input_tokens", 0) + usage.get(
            "cache_read_input_tokens", 0))
        self.output_tokens += usage.get("completion_tokens", usage.get("output_tokens", 0))
        spec = usage.get("speculative") or {}
        self.verify_steps += spec.get("verify_steps") or 0
        self.accepted += spec.get("accepted_tokens") or 0

    def describe(self, seconds: float) -> str:
        failed = sum(self.failed.values())
        text = (f"{self.ok + failed} requests, {self.ok} answered" + (f", {failed} failed (" + ", ".join(
            f"{n} x {code}" for code, n in sorted(self.failed.items(), key=str)) + ")" if failed else "")
            + f" in {seconds:.1f} s: {self.prompt_tokens} prompt tokens, {self.output_tokens} generated "
            f"({self.output_tokens / max(seconds, 1e-9):.1f} tok/s)")
        if self.verify_steps:
            text += f", τ {(self.accepted + self.verify_steps) / self.verify_steps:.3f} over {self.verify_steps} " \
                    "verify steps"
        return text + (f"; first failure: {self.first_failure}" if self.first_failure else "")


async def answer(app, lines: list[BatchLine], out: Path, concurrency: int, progress=None) -> Tally:
    """Send every line to the ASGI `app` (at most `concurrency` at once) and write the answers to `out` in the
    input's order as they become writable; the file appears, whole, only at the end."""
    import httpx

    from toolkit.atomic import atomic_path

    tally, ready, gate = Tally(), {}, asyncio.Semaphore(concurrency)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://run-batch", timeout=None) as client:
        with atomic_path(out) as tmp, tmp.open("w", encoding="utf-8") as f:
            written = 0

            async def one(line: BatchLine) -> None:
                nonlocal written
                async with gate:
                    try:
                        response = await client.post(line.url, json=line.body)
                        status, body = response.status_code, response.json()
                        record = line.output(status, body)
                    except Exception as e:  # the endpoint raised, or answered with no JSON: the line says so
                        status, body = None, f"{type(e).__name__}: {e}"
                        record = line.failed(body)
                tally.add(line, status, body)
                ready[line.index] = record
                while written in ready:  # the answers so far that follow on from those written
                    f.write(json.dumps(ready.pop(written), ensure_ascii=False) + "\n")
                    written += 1
                if progress is not None:
                    progress.update()

            await asyncio.gather(*(one(line) for line in lines))
    return tally


def main(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from toolkit.atomic import check_out_path
    from toolkit.serve.app import build_app

    lines = read_batch(args.input_file)  # a bad file fails here, before minutes of loading
    check_out_path("--output-file", args.output_file, folder=False)
    if Path(args.output_file).resolve() == Path(args.input_file).resolve():
        raise ValueError("--output-file is the input file; give another path for the answers")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ValueError(f"--max-concurrency must be >= 1, got {args.max_concurrency}")
    tree, branch = engine_args.check(args, "run-batch")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise: the bar counts them
    # the in-flight limit bounds the queue; a request's n choices wait as n sequences, so the queue is not the limit
    stack = engine_args.build(args, tree, branch, max_queue=1 << 16, command="run-batch")
    batcher = stack.served.batcher
    concurrency = args.max_concurrency or 2 * args.max_batch_size
    print(f"toolkit run-batch: {len(lines)} requests from {args.input_file}, {concurrency} at a time, with "
          f"{stack.description}", file=sys.stderr)
    batcher.start()
    start = time.perf_counter()
    try:
        with tqdm(total=len(lines), unit="req", desc="run-batch", file=sys.stderr, disable=None) as progress:
            tally = asyncio.run(answer(build_app(stack.served), lines, Path(args.output_file), concurrency, progress))
    finally:
        batcher.stop()
    print(f"toolkit run-batch: {tally.describe(time.perf_counter() - start)}; wrote {args.output_file}", flush=True)
    return 0
