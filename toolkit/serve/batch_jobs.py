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
from pydantic import BaseModel, ValidationError

from toolkit.serve.batch_file import URLS, BatchLine, parse_batch
from toolkit.serve.file_store import FileStore
from toolkit.serve.protocol import ApiError, validation_error
from toolkit.serve.batch_send import Tally, send_all


class BatchCreate(BaseModel):
    input_file_id: str
    endpoint: Literal[URLS]
    completion_window: Literal["24h"] = "24h"
    metadata: dict[str, str] | None = None


@dataclass(eq=False)
class Job:
    id: str
    create: BatchCreate
    lines: list[BatchLine]
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

    def card(self) -> dict:
        t = self.tally
        stamps = {f"{s}_at": self.stamps.get(f"{s}_at") for s in
                  ("in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled")}
        return {"id": self.id, "object": "batch", "endpoint": self.create.endpoint,
                "errors": {"object": "list", "data": self.errors} if self.errors else None,
                "input_file_id": self.create.input_file_id, "completion_window": self.create.completion_window,
                "status": self.status, "output_file_id": self.output_file_id, "error_file_id": self.error_file_id,
                "created_at": self.created_at, "expires_at": self.created_at + 24 * 3600, **stamps,
                "request_counts": {"total": len(self.lines), "completed": t.ok, "failed": sum(t.failed.values())},
                "metadata": self.create.metadata,
                "usage": {"input_tokens": t.prompt_tokens, "output_tokens": t.output_tokens,
                          "total_tokens": t.prompt_tokens + t.output_tokens},
                "speculative": {"verify_steps": t.verify_steps, "accepted_tokens": t.accepted,
                                "tau": round((t.accepted + t.verify_steps) / t.verify_steps, 4) if t.verify_steps
                                else None}}


class Jobs:
    def __init__(self, app, files: FileStore, concurrency: int):
        self.app, self.files, self.concurrency, self.jobs = app, files, concurrency, {}

    def start(self, create: BatchCreate) -> Job:
        source = self.files.get(create.input_file_id, "input_file_id")
        try:
            lines = parse_batch(source.data.decode("utf-8").splitlines(), source.filename, create.endpoint)
            errors = []
        except (ValueError, UnicodeDecodeError) as e:
            lines, errors = [], [{"code": "invalid_batch_file", "message": str(e), "param": "input_file_id",
                                  "line": None}]
        job = Job(f"batch_{uuid.uuid4().hex}", create, lines, errors=errors)
        self.jobs[job.id] = job
        if errors:
            job.stamp("failed")
        else:
            job.stamp("in_progress")
            job.task = asyncio.get_running_loop().create_task(self.run(job))
        return job

    async def run(self, job: Job) -> None:
        def done(line: BatchLine, status, body, record) -> None:
            job.tally.add(line, status, body)
            job.answers[line.index] = (status == 200, record)

        try:
            await send_all(self.app, job.lines, self.concurrency, done)
        except asyncio.CancelledError:  # cancelled: what was answered is written all the same
            self.finish(job, "cancelled")
            return
        job.stamp("finalizing")
        self.finish(job, "completed")

    def finish(self, job: Job, status: str) -> None:
        """The answers so far as the output file (200s) and error file (the rest), in the input's order."""
        for ok, attr in ((True, "output_file_id"), (False, "error_file_id")):
            records = [r for i, (good, r) in sorted(job.answers.items()) if good == ok]
            if records:
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

    def get(self, bid: str) -> Job:
        if bid not in self.jobs:
            raise ApiError(404, f"no batch {bid!r} on this server (batches live while it runs)", None, "not_found")
        return self.jobs[bid]

    def cancel(self, bid: str) -> Job:
        job = self.get(bid)
        if job.status != "in_progress":
            raise ApiError(409, f"batch {bid} is {job.status}; only an in_progress batch can be cancelled", None,
                           "batch_not_cancellable")
        job.stamp("cancelling")
        job.task.cancel()
        return job


def add_batches_routes(app, files: FileStore, concurrency: int) -> Jobs:
    jobs = Jobs(app, files, concurrency)

    @app.post("/v1/batches")
    async def create(request: Request):
        try:
            data = json.loads(await request.body())
            body = BatchCreate.model_validate(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ApiError(400, f"malformed JSON body: {e}", None, "json_invalid") from None
        except ValidationError as e:
            raise validation_error(e.errors()) from None
        return jobs.start(body).card()

    @app.get("/v1/batches/{bid}")
    async def retrieve(bid: str):
        return jobs.get(bid).card()

    @app.post("/v1/batches/{bid}/cancel")
    async def cancel(bid: str):
        return jobs.cancel(bid).card()

    @app.get("/v1/batches")
    async def listed(limit: int = 20, after: str | None = None):
        if not 1 <= limit <= 100:
            raise ApiError(400, f"limit: give 1..100, got {limit}", "limit")
        newest = list(jobs.jobs.values())[::-1]
        ids = [j.id for j in newest]
        if after is not None and after not in ids:
            raise ApiError(400, f"after: no batch {after!r} on this server", "after")
        start = 0 if after is None else ids.index(after) + 1
        page = [j.card() for j in newest[start:start + limit]]
        return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None, "has_more": start + limit < len(newest)}

    return jobs
