"""Finished HTTP requests: the record of one, and where they go (a log line, the dashboard's pane).

The server's access log (kinfer.server.access_log) makes one `RequestRecord` per request and hands it
to the runtime's `RequestLog`, which writes the line on the `kinfer.requests` logger, as Ollama's and
llama-server's logs have one, and tells each listener:

    127.0.0.1 "POST /v1/chat/completions" 200 openai smollm2:135m prompt=45 cached=32 generated=20 stop 1.23s
    127.0.0.1 "GET /api/tags" 200 ollama 2ms
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

LOGGER_NAME = "kinfer.requests"
log = logging.getLogger(LOGGER_NAME)


@dataclass(frozen=True)
class RequestRecord:
    """One finished HTTP request. Token counts are those of the generation it ran, if any."""

    finished_at: float  # Unix time
    method: str
    path: str
    status: int  # 0 when the client left before a status was sent
    client: str
    duration: float  # seconds from arrival to the last byte
    dialect: str
    model: str = ""
    request_id: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated: int = 0
    finish: str = ""  # how its generation ended; empty for requests that generated nothing

    @property
    def generation(self) -> bool:
        return bool(self.finish)

    def line(self) -> str:
        parts = [self.client or "-", f'"{self.method} {self.path}"', str(self.status or "-"), self.dialect]
        if self.model:
            parts.append(self.model)
        if self.generation:
            parts.append(
                f"prompt={self.prompt_tokens} cached={self.cached_tokens} generated={self.generated} "
                f"{self.finish}"
            )
        parts.append(f"{self.duration * 1000:.0f}ms" if self.duration < 1 else f"{self.duration:.2f}s")
        return " ".join(parts)


class RequestLog:
    """Where finished requests go: the `kinfer.requests` logger, and every listener."""

    def __init__(self) -> None:
        self.listeners: list[Callable[[RequestRecord], None]] = []

    def emit(self, record: RequestRecord) -> None:
        log.info("%s", record.line())
        for listener in self.listeners:
            try:
                listener(record)
            except Exception:  # a broken listener must not cost the server a request
                log.exception("a request-log listener failed")
