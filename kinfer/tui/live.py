"""`LiveSource`: samples from a running scheduler, plus the HTTP requests that finished in between."""

from __future__ import annotations

from collections import deque

import psutil

from kinfer.request_log import RequestLog, RequestRecord
from kinfer.scheduler import Scheduler
from kinfer.tui.sample import DashboardSample, LogEntry
from kinfer.tui.system import GpuProbe, read_system

LOG_BACKLOG = 1024  # finished requests kept between two ticks; a burst beyond it drops the oldest


def log_entry(record: RequestRecord) -> LogEntry:
    """The request log's line for a finished HTTP request."""
    return LogEntry(
        finished_at=record.finished_at,
        request_id=record.request_id,
        dialect=record.dialect,
        model=record.model,
        prompt_tokens=record.prompt_tokens,
        generated=record.generated,
        finish=record.finish,
        duration=record.duration,
        method=record.method,
        path=record.path,
        status=record.status,
        cached_tokens=record.cached_tokens,
    )


class LiveSource:
    """Reads `scheduler.snapshot()` on the event loop; never touches engines.

    The server's request log calls our listener as each HTTP request finishes (on the loop); we only
    append to a deque there, so a burst of finished requests costs nothing until the next tick.
    """

    def __init__(
        self, scheduler: Scheduler, requests: RequestLog, *, gpu_probe: GpuProbe | None = None
    ) -> None:
        self.scheduler = scheduler
        self.requests = requests
        self._finished: deque[LogEntry] = deque(maxlen=LOG_BACKLOG)
        self._process = psutil.Process()
        self._gpu = gpu_probe if gpu_probe is not None else GpuProbe()

    def open(self) -> None:
        self.requests.listeners.append(self._on_finished)
        self._gpu.start()

    def close(self) -> None:
        if self._on_finished in self.requests.listeners:
            self.requests.listeners.remove(self._on_finished)
        self._gpu.stop()

    def _on_finished(self, record: RequestRecord) -> None:
        self._finished.append(log_entry(record))

    def __call__(self) -> DashboardSample:
        finished = []
        while self._finished:
            finished.append(self._finished.popleft())
        return DashboardSample(
            scheduler=self.scheduler.snapshot(),
            system=read_system(self._process, self._gpu.latest),
            finished=tuple(finished),
        )
