"""Log records for the log pane while the dashboard owns the terminal.

A `StreamHandler` on stderr would write through Textual's screen; while the dashboard runs, the
root logger's handlers are swapped for one that only queues records, and the app drains the queue
on its refresh tick.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

CAPACITY = 500


@dataclass(frozen=True)
class LogLine:
    created: float  # Unix time
    level: int
    text: str


class QueueLogHandler(logging.Handler):
    """Keeps the newest records; `drain()` hands them over once. Safe from any thread."""

    def __init__(
        self, level: int = logging.INFO, capacity: int = CAPACITY, skip: tuple[str, ...] = ()
    ) -> None:
        """`skip`: loggers whose records the screen shows another way (below WARNING only)."""
        super().__init__(level)
        self._lines: deque[LogLine] = deque(maxlen=capacity)
        self._skip = skip

    def emit(self, record: logging.LogRecord) -> None:
        if record.name in self._skip and record.levelno < logging.WARNING:
            return
        try:
            text = record.getMessage()
            if record.levelno >= logging.WARNING:  # info lines read better without the logger's name
                text = f"{record.levelname.lower()}: {record.name}: {text}"
            if record.exc_info:
                text += f" ({record.exc_info[1]!r})"
            self._lines.append(LogLine(record.created, record.levelno, text))
        except Exception:
            self.handleError(record)

    def drain(self) -> list[LogLine]:
        lines = []
        while self._lines:
            lines.append(self._lines.popleft())
        return lines


@contextmanager
def captured_logging(handler: QueueLogHandler) -> Iterator[QueueLogHandler]:
    """Route the root logger to `handler` only, and put the old handlers back afterwards."""
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers = [handler]
    try:
        yield handler
    finally:
        root.handlers = saved
