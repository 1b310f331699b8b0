"""OpenAI's Files API over memory, for batch jobs: `POST /v1/files` (multipart: `file`, `purpose`), `GET /v1/files`
(newest first, `purpose` / `limit` / `after` / `order`), `GET` / `DELETE /v1/files/{id}`, `GET /v1/files/{id}/content`.

The server holds the files (uploads and batch jobs' output and error files) while it runs, up to a total size;
an upload beyond it is refused with 413 and names what to delete. They are gone when the server stops.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import Response

from toolkit.serve.api_error import ApiError

PURPOSES = ("batch", "batch_output", "user_data", "assistants", "fine-tune", "vision", "evals")


@dataclass
class StoredFile:
    id: str
    filename: str
    purpose: str
    data: bytes
    created_at: int

    def card(self) -> dict:
        return {"id": self.id, "object": "file", "bytes": len(self.data), "created_at": self.created_at,
                "filename": self.filename, "purpose": self.purpose, "status": "processed", "expires_at": None,
                "status_details": None}


class FileStore:
    def __init__(self, max_bytes: int = 256 << 20):
        self.max_bytes, self.files = max_bytes, {}

    def put(self, filename: str, purpose: str, data: bytes) -> StoredFile:
        held = sum(len(f.data) for f in self.files.values())
        if held + len(data) > self.max_bytes:
            raise ApiError(413, f"the server holds {held} bytes of files and takes {self.max_bytes} in all; "
                                f"this {len(data)}-byte file does not fit: delete files (DELETE /v1/files/{{id}}) "
                                "first", "file", "file_store_full")
        stored = StoredFile(f"file-{uuid.uuid4().hex}", filename, purpose, data, int(time.time()))
        self.files[stored.id] = stored
        return stored

    def get(self, fid: str, param: str | None = None) -> StoredFile:
        if fid not in self.files:
            raise ApiError(404, f"no file {fid!r} on this server (files live while it runs)", param, "not_found")
        return self.files[fid]

    def page(self, purpose: str | None, limit: int, after: str | None, order: str) -> dict:
        if order not in ("asc", "desc"):
            raise ApiError(400, f"order: give asc or desc, got {order!r}", "order")
        if not 1 <= limit <= 10000:
            raise ApiError(400, f"limit: give 1..10000, got {limit}", "limit")
        files = [f for f in self.files.values() if purpose is None or f.purpose == purpose]  # insertion: oldest first
        files = files if order == "asc" else files[::-1]
        ids = [f.id for f in files]
        if after is not None and after not in ids:
            raise ApiError(400, f"after: no file {after!r} in this list", "after")
        start = 0 if after is None else ids.index(after) + 1
        page = [f.card() for f in files[start:start + limit]]
        return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None, "has_more": start + limit < len(files)}


def add_files_routes(app, files: FileStore) -> None:
    @app.post("/v1/files")
    async def upload(request: Request):
        try:
            form = await request.form()
        except Exception as e:  # not multipart, or a broken one
            raise ApiError(400, f"the body must be multipart/form-data with `file` and `purpose` ({e})", "file")
        upload, purpose = form.get("file"), form.get("purpose")
        if upload is None or isinstance(upload, str):
            raise ApiError(400, "file: send the file as a multipart file part named `file`", "file")
        if purpose not in PURPOSES:
            raise ApiError(400, f"purpose: give one of {', '.join(PURPOSES)} (batch for /v1/batches), got "
                                f"{purpose!r}", "purpose")
        return files.put(upload.filename or "upload", purpose, await upload.read()).card()

    @app.get("/v1/files")
    async def listed(purpose: str | None = None, limit: int = 10000, after: str | None = None, order: str = "desc"):
        return files.page(purpose, limit, after, order)

    @app.get("/v1/files/{fid}")
    async def card(fid: str):
        return files.get(fid).card()

    @app.get("/v1/files/{fid}/content")
    async def content(fid: str):
        return Response(files.get(fid).data, media_type="application/octet-stream")

    @app.delete("/v1/files/{fid}")
    async def delete(fid: str):
        files.get(fid)
        del files.files[fid]
        return {"id": fid, "object": "file", "deleted": True}
