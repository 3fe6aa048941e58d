"""The access log: one `RequestRecord` per HTTP request, handed to the runtime's `RequestLog`.

An ASGI middleware around the app notes when a request arrives and its status, and makes the record
once the app has sent the last byte (a streamed reply included) or the client has gone: on the event
loop, after the response, with no work per token. A generation's tokens come from its
`RequestStream`, which the scheduler announces as it queues it, in the handler's own context.
"""

from __future__ import annotations

import contextvars
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kinfer.request_log import RequestLog, RequestRecord
from kinfer.server.dialects import dialect_for

if TYPE_CHECKING:
    from kinfer.scheduler import RequestStream, Scheduler

OWN_PATHS = ("/health", "/metrics", "/openapi.json")  # kinfer's, not a dialect's


@dataclass
class _Pending:
    arrived: float
    status: int = 0
    stream: RequestStream | None = None


_CURRENT: contextvars.ContextVar[_Pending | None] = contextvars.ContextVar("kinfer_request", default=None)


def note_stream(stream: RequestStream) -> None:
    """Scheduler hook: the request being handled in this context runs `stream`."""
    pending = _CURRENT.get()
    if pending is not None and pending.stream is None:
        pending.stream = stream


class RequestLogMiddleware:
    """ASGI middleware: a `RequestRecord` for every HTTP request the app answers."""

    def __init__(self, app: Any, requests: RequestLog) -> None:
        self.app = app
        self.requests = requests

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        pending = _Pending(arrived=time.monotonic())
        token = _CURRENT.set(pending)

        async def send_noting_status(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                pending.status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_noting_status)
        finally:
            _CURRENT.reset(token)
            self.requests.emit(record_of(scope, pending))


def record_of(scope: dict[str, Any], pending: _Pending) -> RequestRecord:
    path = scope.get("path", "")
    client = scope.get("client")
    common: dict[str, Any] = dict(
        finished_at=time.time(),
        method=scope.get("method", ""),
        path=path,
        status=pending.status,
        client=str(client[0]) if client else "",
        duration=time.monotonic() - pending.arrived,
        dialect=dialect_of(path),
    )
    stream = pending.stream
    if stream is None:
        return RequestRecord(**common)
    common.update(dialect=stream.request.dialect, model=stream.model)
    if pending.status >= 400:  # refused before it generated (a prompt too long, a full queue)
        return RequestRecord(**common)
    return RequestRecord(
        **common,
        request_id=stream.request.request_id or stream.job_id,
        prompt_tokens=stream.prompt_tokens,
        cached_tokens=stream.reused,
        generated=stream.generated,
        finish=stream.finish or "cancelled",  # still running: the client left, the row is being freed
    )


def dialect_of(path: str) -> str:
    """The dialect a request that generated nothing is logged under (generations name their own)."""
    return "kinfer" if path in OWN_PATHS else dialect_for(path).name


def install_request_log(app: Any, scheduler: Scheduler, requests: RequestLog) -> None:
    """Wrap `app` (a Quart app) so every request it answers is logged, generations with their tokens."""
    app.asgi_app = RequestLogMiddleware(app.asgi_app, requests)
    if note_stream not in scheduler.submitted:
        scheduler.submitted.append(note_stream)
