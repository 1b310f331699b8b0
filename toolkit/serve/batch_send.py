"""A batch's requests sent through an ASGI app (the serving API, in this process), a bounded number at a time, and
the tally of their answers: counts, tokens and the speculation figures read from each answer's usage. Shared by
`toolkit run-batch` (run_batch.py) and the server's batch jobs (batch_jobs.py)."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from toolkit.serve.batch_file import BatchLine


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

    @property
    def tau(self) -> float | None:
        """Tokens per verify step, the bonus token included (None before any verify step)."""
        return (self.accepted + self.verify_steps) / self.verify_steps if self.verify_steps else None

    def describe(self, seconds: float) -> str:
        failed = sum(self.failed.values())
        text = (f"{self.ok + failed} requests, {self.ok} answered" + (f", {failed} failed (" + ", ".join(
            f"{n} x {code}" for code, n in sorted(self.failed.items(), key=str)) + ")" if failed else "")
            + f" in {seconds:.1f} s: {self.prompt_tokens} prompt tokens, {self.output_tokens} generated "
            f"({self.output_tokens / max(seconds, 1e-9):.1f} tok/s)")
        if self.verify_steps:
            text += f", τ {self.tau:.3f} over {self.verify_steps} " \
                    "verify steps"
        return text + (f"; first failure: {self.first_failure}" if self.first_failure else "")


async def send_all(app, lines: list[BatchLine], concurrency: int, done) -> None:
    """Send every line to the ASGI `app`, at most `concurrency` at once, and call done(line, status, body, record)
    as each is answered: status None (and body the exception's text) when the app raised or sent no JSON; a 429
    (queue full: live requests came first) waits and goes again rather than failing the line."""
    import httpx

    gate = asyncio.Semaphore(concurrency)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://run-batch", timeout=None) as client:
        async def one(line: BatchLine) -> None:
            async with gate:
                while True:
                    try:
                        response = await client.post(line.url, json=line.body)
                        if response.status_code == 429:
                            await asyncio.sleep(0.5)
                            continue
                        status, body = response.status_code, response.json()
                        record = line.output(status, body)
                    except Exception as e:  # the endpoint raised, or answered with no JSON: the line says so
                        status, body = None, f"{type(e).__name__}: {e}"
                        record = line.failed(body)
                    break
            done(line, status, body, record)

        await asyncio.gather(*(one(line) for line in lines))
