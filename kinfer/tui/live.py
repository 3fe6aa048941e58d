"""`LiveSource`: samples from a running scheduler, plus the requests that finished in between."""

from __future__ import annotations

import time
from collections import deque

import psutil

from kinfer.scheduler import RequestStream, Scheduler
from kinfer.tui.sample import DashboardSample, LogEntry
from kinfer.tui.system import GpuProbe, read_system

LOG_BACKLOG = 1024  # finished requests kept between two ticks; a burst beyond it drops the oldest


def log_entry(stream: RequestStream, now: float | None = None) -> LogEntry:
    """The request log's line for a finished request."""
    return LogEntry(
        finished_at=time.time() if now is None else now,
        request_id=stream.request.request_id or stream.job_id,
        dialect=stream.request.dialect,
        model=stream.model,
        prompt_tokens=stream.prompt_tokens,
        generated=stream.generated,
        finish=stream.finish or "error",
        duration=stream.timings(stream.finished_at).total,
    )


class LiveSource:
    """Reads `scheduler.snapshot()` on the event loop; never touches engines.

    The scheduler calls our listener as each request finishes (on the loop); we only append to a
    deque there, so a burst of finishing requests costs nothing until the next tick drains it.
    """

    def __init__(self, scheduler: Scheduler, *, gpu_probe: GpuProbe | None = None) -> None:
        self.scheduler = scheduler
        self._finished: deque[LogEntry] = deque(maxlen=LOG_BACKLOG)
        self._process = psutil.Process()
        self._gpu = gpu_probe if gpu_probe is not None else GpuProbe()

    def open(self) -> None:
        self.scheduler.listeners.append(self._on_finished)
        self._gpu.start()

    def close(self) -> None:
        if self._on_finished in self.scheduler.listeners:
            self.scheduler.listeners.remove(self._on_finished)
        self._gpu.stop()

    def _on_finished(self, stream: RequestStream) -> None:
        self._finished.append(log_entry(stream))

    def __call__(self) -> DashboardSample:
        finished = []
        while self._finished:
            finished.append(self._finished.popleft())
        return DashboardSample(
            scheduler=self.scheduler.snapshot(),
            system=read_system(self._process, self._gpu.latest),
            finished=tuple(finished),
        )
