"""Streaming responses: SSE and NDJSON framing, and cancelling the row when the client leaves."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from quart import Response

from kinfer.scheduler import RequestStream
from kinfer.server.wire import json_dumps

log = logging.getLogger(__name__)


def sse(data: object, event: str | None = None) -> str:
    text = data if isinstance(data, str) else json_dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n"


def ndjson(data: object) -> str:
    return json_dumps(data) + "\n"


async def guarded(stream: RequestStream, body: AsyncIterator[str]) -> AsyncIterator[str]:
    """Yield the body; if the client disconnects (the task is cancelled) free the request's row."""
    try:
        async for chunk in body:
            yield chunk
    except (asyncio.CancelledError, GeneratorExit):
        stream.cancel()
        raise
    finally:
        if not stream.done:
            stream.cancel()


def streaming_response(stream: RequestStream, body: AsyncIterator[str], mimetype: str) -> Response:
    response = Response(guarded(stream, body), mimetype=mimetype)
    response.timeout = None  # a long reply is not a stalled one
    response.headers["Cache-Control"] = "no-cache"
    response.headers["X-Accel-Buffering"] = "no"
    return response
