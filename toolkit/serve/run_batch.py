"""Answer a batch file with the speculative engine in this process, no server: OpenAI's batch input format (as
`vllm run-batch` reads it: chat, completions, responses and messages requests) or Anthropic's Message Batches
requests, one per line; the output file holds one answer per line in the input's order.

    toolkit run-batch -i requests.jsonl -o results.jsonl --draft ./ckpt [--max-batch-size 16] [--num-steps 5 ...]

Either file may be an http(s) URL, as with vLLM's: the input is fetched with GET, the output PUT whole once written
(retried; a presigned object-store URL works).

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
from pathlib import Path

from toolkit.serve import engine_args
from toolkit.serve.batch_file import BatchLine, parse_batch_bytes, read_batch
from toolkit.serve.batch_send import Tally, send_all


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-i", "--input-file", required=True, help="batch file: one request per line (OpenAI's "
                   "{custom_id, method, url, body} or Anthropic's {custom_id, params}); a path, or an http(s) URL "
                   "to GET it from")
    p.add_argument("-o", "--output-file", required=True, help="where the answers go, one line per request: a path, "
                   "or an http(s) URL to PUT the whole file to (a presigned upload URL)")
    p.add_argument("--output-tmp-dir", default=None, help="with an output URL: the folder the file is written in "
                   "before the upload (default: the system's temp folder)")
    p.add_argument("--max-concurrency", type=int, default=None, metavar="N",
                   help="requests in flight at once (default: twice --max-batch-size, so the batch stays full)")
    engine_args.add_args(p)


async def answer(app, lines: list[BatchLine], out: Path, concurrency: int, progress=None) -> Tally:
    """Answer every line through the ASGI `app` and write the answers to `out` in the input's order as they become
    writable; the file appears, whole, only at the end."""
    from toolkit.atomic import atomic_path

    tally, ready, written = Tally(), {}, 0
    with atomic_path(out) as tmp, tmp.open("w", encoding="utf-8") as f:
        def done(line: BatchLine, status, body, record) -> None:
            nonlocal written
            tally.add(line, status, body)
            ready[line.index] = record
            while written in ready:  # the answers so far that follow on from those written
                f.write(json.dumps(ready.pop(written), ensure_ascii=False) + "\n")
                written += 1
            if progress is not None:
                progress.update()

        await send_all(app, lines, concurrency, done)
    return tally


UPLOAD_TRIES, UPLOAD_WAIT = 5, 5.0  # an output URL's PUT: tries, and seconds between them (as vLLM's run-batch)


def is_url(path: str) -> bool:
    return path.startswith(("http://", "https://"))


def read_lines(source: str) -> list[BatchLine]:
    """The batch file's requests, from a path or an http(s) URL."""
    if not is_url(source):
        return read_batch(source)
    import httpx

    try:
        response = httpx.get(source, timeout=300, follow_redirects=True)
    except httpx.HTTPError as e:
        raise ValueError(f"--input-file {source}: cannot fetch it ({type(e).__name__}: {e})") from None
    if response.status_code != 200:
        raise ValueError(f"--input-file {source}: GET answered HTTP {response.status_code}")
    return parse_batch_bytes(response.content, source)


def upload(path: Path, url: str) -> None:
    """PUT the finished file to `url`, retried UPLOAD_TRIES times; a RuntimeError names the last failure."""
    import httpx

    for attempt in range(1, UPLOAD_TRIES + 1):
        try:
            response = httpx.put(url, content=path.read_bytes(), timeout=1000)
            if response.status_code in (200, 201, 204):
                return
            failure = f"HTTP {response.status_code}"
        except httpx.HTTPError as e:
            failure = f"{type(e).__name__}: {e}"
        if attempt < UPLOAD_TRIES:
            time.sleep(UPLOAD_WAIT)
    raise RuntimeError(f"--output-file {url}: the upload failed {UPLOAD_TRIES} times, last with {failure}")


def main(args: argparse.Namespace) -> int:
    import tempfile
    from contextlib import nullcontext

    from tqdm import tqdm

    from toolkit.atomic import check_out_path
    from toolkit.serve.app import build_app

    lines = read_lines(args.input_file)  # a bad file fails here, before minutes of loading
    if is_url(args.output_file):
        if args.output_tmp_dir is not None and not Path(args.output_tmp_dir).is_dir():
            raise ValueError(f"--output-tmp-dir {args.output_tmp_dir}: no such folder")
    else:
        check_out_path("--output-file", args.output_file, folder=False)
        if not is_url(args.input_file) and Path(args.output_file).resolve() == Path(args.input_file).resolve():
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
    # an output URL: the file is written in a temp folder first, then PUT; a path: written there (atomically)
    staging = tempfile.TemporaryDirectory(dir=args.output_tmp_dir) if is_url(args.output_file) else nullcontext()
    with staging as tmp:
        out = Path(tmp) / "answers.jsonl" if tmp else Path(args.output_file)
        try:
            with tqdm(total=len(lines), unit="req", desc="run-batch", file=sys.stderr, disable=None) as progress:
                tally = asyncio.run(answer(build_app(stack.served), lines, out, concurrency, progress))
        finally:
            batcher.stop()
        seconds = time.perf_counter() - start
        if is_url(args.output_file):
            upload(out, args.output_file)
    print(f"toolkit run-batch: {tally.describe(seconds)}; wrote {args.output_file}", flush=True)
    return 0
