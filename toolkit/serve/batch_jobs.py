"""OpenAI's Batch API on the server: `POST /v1/batches` (an uploaded batch file, section 12a of docs/formats.md,
run in the background through this server's own endpoints), `GET /v1/batches/{id}`, `GET /v1/batches` (newest
first, `limit` / `after`), `POST /v1/batches/{id}/cancel`; the answers land in the file store (file_store.py) as
the batch's output file (the 200s) and error file (the rest), in the input's order.

A job sends at most --max-batch-size requests at a time, so live requests still find the queue; they share the
running batch with it. Its figures: `request_counts`, `usage` (tokens) and, beside them, `speculative` (verify
steps, accepted draft tokens, τ). A file that is not a batch file, or whose lines go to another endpoint, fails the
job at once (`status: failed`, the line in `errors`), as OpenAI's validation does.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Literal

from fastapi import Request
from pydantic import BaseModel

from toolkit.serve.api_error import ApiError
from toolkit.serve.batch_file import URLS, BatchLine, parse_batch_bytes
from toolkit.serve.batch_send import Tally, send_all
from toolkit.serve.file_store import FileStore
from toolkit.serve.json_body import read_object, validated


class BatchCreate(BaseModel):
    input_file_id: str
    endpoint: Literal[URLS]
    completion_window: Literal["24h"] = "24h"
    metadata: dict[str, str] | None = None


@dataclass(eq=False)
class Job:
    """A batch's requests and how far they got. `status`: in_progress, cancelling, then completed or cancelled
    (or failed: a bad file, or outputs that did not fit the file store)."""
    id: str
    lines: list[BatchLine]
    create: BatchCreate | None = None  # an OpenAI batch's request (None: Anthropic's Message Batches)
    created_at: int = field(default_factory=lambda: int(time.time()))
    status: str = "in_progress"
    errors: list = field(default_factory=list)
    stamps: dict = field(default_factory=dict)  # in_progress_at, finalizing_at, completed_at, ...
    answers: dict = field(default_factory=dict)  # index -> (ok, record)
    tally: Tally = field(default_factory=Tally)
    output_file_id: str | None = None
    error_file_id: str | None = None
    task: asyncio.Task | None = None

    def stamp(self, status: str) -> None:
        self.status = status
        self.stamps[f"{status}_at"] = int(time.time())


def openai_card(job: Job) -> dict:
    """The Batch object OpenAI's API returns, with the speculation figures beside `usage`."""
    t = job.tally
    stamps = {f"{s}_at": job.stamps.get(f"{s}_at") for s in
              ("in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled")}
    return {"id": job.id, "object": "batch", "endpoint": job.create.endpoint,
            "errors": {"object": "list", "data": job.errors} if job.errors else None,
            "input_file_id": job.create.input_file_id, "completion_window": job.create.completion_window,
            "status": job.status, "output_file_id": job.output_file_id, "error_file_id": job.error_file_id,
            "created_at": job.created_at, "expires_at": job.created_at + 24 * 3600, **stamps,
            "request_counts": {"total": len(job.lines), "completed": t.ok, "failed": sum(t.failed.values())},
            "metadata": job.create.metadata,
            "usage": {"input_tokens": t.prompt_tokens, "output_tokens": t.output_tokens,
                      "total_tokens": t.prompt_tokens + t.output_tokens},
            "speculative": {"verify_steps": t.verify_steps, "accepted_tokens": t.accepted,
                            "tau": None if t.tau is None else round(t.tau, 4)}}


class Jobs:
    """The server's batch jobs (OpenAI's and Anthropic's), each a task on the event loop."""

    def __init__(self, app, files: FileStore, concurrency: int):
        self.app, self.files, self.concurrency, self.jobs = app, files, concurrency, {}

    def openai(self, create: BatchCreate) -> Job:
        """An OpenAI batch over an uploaded file: failed at once when the file is not a batch file."""
        source = self.files.get(create.input_file_id, "input_file_id")
        try:
            lines = parse_batch_bytes(source.data, source.filename, create.endpoint)
            errors = []
        except (ValueError, UnicodeDecodeError) as e:
            lines, errors = [], [{"code": "invalid_batch_file", "message": str(e), "param": "input_file_id",
                                  "line": None}]
        job = Job(f"batch_{uuid.uuid4().hex}", lines, create, errors=errors)
        if errors:
            self.jobs[job.id] = job
            job.stamp("failed")
            return job
        return self.start(job)

    def start(self, job: Job) -> Job:
        self.jobs[job.id] = job
        job.stamp("in_progress")
        job.task = asyncio.get_running_loop().create_task(self.run(job))
        return job

    async def run(self, job: Job) -> None:
        def done(line: BatchLine, status, body, record) -> None:
            job.tally.add(line, status, body)
            job.answers[line.index] = (status == 200, record)

        try:
            await send_all(self.app, job.lines, self.concurrency, done)
        except asyncio.CancelledError:  # cancelled: what was answered is kept all the same
            self.finish(job, "cancelled")
            return
        job.stamp("finalizing")
        self.finish(job, "completed")

    def finish(self, job: Job, status: str) -> None:
        """An OpenAI batch's answers so far as its output file (200s) and error file (the rest), in the input's
        order; an Anthropic batch keeps them for its results."""
        for ok, attr in ((True, "output_file_id"), (False, "error_file_id")):
            records = [r for i, (good, r) in sorted(job.answers.items()) if good == ok]
            if records and job.create is not None:
                text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
                try:
                    stored = self.files.put(f"{job.id}_{'output' if ok else 'error'}.jsonl", "batch_output",
                                            text.encode())
                except ApiError as e:  # the store is full: the job fails, saying so
                    job.errors.append({"code": "file_store_full", "message": e.message, "param": None, "line": None})
                    job.stamp("failed")
                    return
                setattr(job, attr, stored.id)
        job.stamp(status)

    def get(self, bid: str, anthropic: bool = False) -> Job:
        job = self.jobs.get(bid)
        if job is None or (job.create is None) != anthropic:
            raise ApiError(404, f"no batch {bid!r} on this server (batches live while it runs)", None, "not_found")
        return job

    def cancel(self, bid: str, anthropic: bool = False) -> Job:
        job = self.get(bid, anthropic)
        if job.status != "in_progress":
            raise ApiError(409, f"batch {bid} is {job.status}; only an in_progress batch can be cancelled", None,
                           "batch_not_cancellable")
        job.stamp("cancelling")
        job.task.cancel()
        return job

    def page(self, anthropic: bool, limit: int, after: str | None) -> tuple[list[Job], bool]:
        """Newest first: up to `limit` jobs of one kind after the one `after` names, and whether more follow."""
        if not 1 <= limit <= 1000:
            raise ApiError(400, f"limit: give 1..1000, got {limit}", "limit")
        newest = [j for j in list(self.jobs.values())[::-1] if (j.create is None) == anthropic]
        ids = [j.id for j in newest]
        if after is not None and after not in ids:
            raise ApiError(400, f"no batch {after!r} on this server to page after", "after_id" if anthropic else
                           "after")
        start = 0 if after is None else ids.index(after) + 1
        return newest[start:start + limit], start + limit < len(newest)


def add_batches_routes(app, jobs: Jobs) -> None:
    @app.post("/v1/batches")
    async def create(request: Request):
        return openai_card(jobs.openai(validated(BatchCreate, await read_object(request))))

    @app.get("/v1/batches/{bid}")
    async def retrieve(bid: str):
        return openai_card(jobs.get(bid))

    @app.post("/v1/batches/{bid}/cancel")
    async def cancel(bid: str):
        return openai_card(jobs.cancel(bid))

    @app.get("/v1/batches")
    async def listed(limit: int = 20, after: str | None = None):
        page, more = jobs.page(False, limit, after)
        cards = [openai_card(j) for j in page]
        return {"object": "list", "data": cards, "first_id": cards[0]["id"] if cards else None,
                "last_id": cards[-1]["id"] if cards else None, "has_more": more}
