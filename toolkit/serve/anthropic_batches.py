"""Anthropic's Message Batches API on the server: `POST /v1/messages/batches` ({"requests": [{custom_id, params}]},
each params a /v1/messages body), `GET /v1/messages/batches/{id}`, `GET /v1/messages/batches` (newest first,
`limit` / `after_id`), `POST /v1/messages/batches/{id}/cancel`, `GET /v1/messages/batches/{id}/results` (JSONL in the
requests' order, once ended; a request the cancel stopped is `canceled`), `DELETE /v1/messages/batches/{id}`.

The requests run as a job of batch_jobs.py (through this server's /v1/messages); errors in Anthropic's shape.
"""
from __future__ import annotations

import functools
import json
import uuid
from datetime import datetime, timezone

from fastapi import Request
from fastapi.responses import Response

from toolkit.serve.anthropic import anthropic_error
from toolkit.serve.api_error import ApiError
from toolkit.serve.batch_file import batch_lines
from toolkit.serve.batch_jobs import Job, Jobs
from toolkit.serve.json_body import read_object

STATUS = {"in_progress": "in_progress", "finalizing": "in_progress", "cancelling": "canceling", "completed": "ended",
          "cancelled": "ended", "failed": "ended"}


def when(stamp: int | None) -> str | None:
    """RFC 3339, as Anthropic's batch timestamps."""
    return None if stamp is None else datetime.fromtimestamp(stamp, timezone.utc).isoformat().replace("+00:00", "Z")


def card(job: Job, base: str) -> dict:
    ended = STATUS[job.status] == "ended"
    answered, t = len(job.answers), job.tally
    return {"id": job.id, "type": "message_batch", "processing_status": STATUS[job.status],
            "request_counts": {"processing": 0 if ended else len(job.lines) - answered, "succeeded": t.ok,
                               "errored": sum(t.failed.values()), "canceled": len(job.lines) - answered if ended else 0,
                               "expired": 0},
            "ended_at": when(job.stamps.get(f"{job.status}_at")) if ended else None,
            "created_at": when(job.created_at), "expires_at": when(job.created_at + 24 * 3600), "archived_at": None,
            "cancel_initiated_at": when(job.stamps.get("cancelling_at")),
            "results_url": f"{base}v1/messages/batches/{job.id}/results" if ended else None}


def results(job: Job) -> str:
    out = []
    for line in job.lines:
        answer = job.answers.get(line.index)
        out.append(answer[1] if answer else {"custom_id": line.custom_id, "result": {"type": "canceled"}})
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in out)


def add_message_batches_routes(app, jobs: Jobs) -> None:
    def ended(bid: str) -> Job:
        job = jobs.get(bid, anthropic=True)
        if STATUS[job.status] != "ended":
            raise ApiError(400, f"message batch {bid} is still {STATUS[job.status]}; its results come once it ended")
        return job

    def anthropic(route):  # an ApiError answered in Anthropic's shape (FastAPI reads the route's own signature)
        @functools.wraps(route)
        async def wrapped(*args, **kwargs):
            try:
                return await route(*args, **kwargs)
            except ApiError as err:
                return anthropic_error(err)
        return wrapped

    @app.post("/v1/messages/batches")
    @anthropic
    async def create(request: Request):
        requests = (await read_object(request)).get("requests")
        if not isinstance(requests, list) or not requests:
            raise ApiError(400, "requests: give a non-empty list of {custom_id, params}", "requests")
        items = ((i, r, f"requests.{i}") for i, r in enumerate(requests))
        try:
            lines = batch_lines(items, "requests")
        except ValueError as e:
            raise ApiError(400, str(e), "requests") from None
        if not lines[0].anthropic:
            raise ApiError(400, "requests.0: each request holds custom_id and params (a Messages body)", "requests")
        job = jobs.start(Job(f"msgbatch_{uuid.uuid4().hex}", lines))
        return card(job, str(request.base_url))

    @app.get("/v1/messages/batches/{bid}")
    @anthropic
    async def retrieve(bid: str, request: Request):
        return card(jobs.get(bid, anthropic=True), str(request.base_url))

    @app.get("/v1/messages/batches")
    @anthropic
    async def listed(request: Request, limit: int = 20, after_id: str | None = None, before_id: str | None = None):
        if before_id is not None:
            raise ApiError(400, "before_id: not served; page with after_id (newest first)", "before_id")
        page, more = jobs.page(True, limit, after_id)
        cards = [card(j, str(request.base_url)) for j in page]
        return {"data": cards, "has_more": more, "first_id": cards[0]["id"] if cards else None,
                "last_id": cards[-1]["id"] if cards else None}

    @app.post("/v1/messages/batches/{bid}/cancel")
    @anthropic
    async def cancel(bid: str, request: Request):
        return card(jobs.cancel(bid, anthropic=True), str(request.base_url))

    @app.get("/v1/messages/batches/{bid}/results")
    @anthropic
    async def results_file(bid: str):
        return Response(results(ended(bid)), media_type="application/x-jsonl")

    @app.delete("/v1/messages/batches/{bid}")
    @anthropic
    async def delete(bid: str):
        del jobs.jobs[ended(bid).id]
        return {"id": bid, "type": "message_batch_deleted"}
