"""What the dashboard reads on each tick: one `DashboardSample`, from a live runtime or a recording.

Every number the screen shows (clock, ages, memory) comes from a sample, so a recording replays the
exact same screen: the snapshot tests depend on that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # only annotations: this module stays importable without the server's modules
    from kinfer.scheduler import SchedulerSnapshot


@dataclass(frozen=True)
class GpuMemory:
    """One GPU's memory, in bytes."""

    name: str
    used: int
    total: int


@dataclass(frozen=True)
class SystemSample:
    """The process and the machine: resident set size, system memory in use, GPUs when known."""

    rss: int
    memory_used: int
    memory_total: int
    gpus: tuple[GpuMemory, ...] = ()


@dataclass(frozen=True)
class LogEntry:
    """One finished HTTP request, for the request log. `finish` is empty for a request that generated
    nothing (`GET /api/tags`, a refusal); such a line shows its method, path and status instead."""

    finished_at: float  # Unix time
    request_id: str
    dialect: str
    model: str
    prompt_tokens: int
    generated: int
    finish: str
    duration: float  # seconds from arrival to the end
    method: str = ""
    path: str = ""
    status: int = 0
    cached_tokens: int = 0


@dataclass(frozen=True)
class DashboardSample:
    """One tick's worth of numbers. `finished`: requests that ended since the previous sample."""

    scheduler: SchedulerSnapshot
    system: SystemSample
    finished: tuple[LogEntry, ...] = ()

    @property
    def taken_at(self) -> float:
        return self.scheduler.taken_at


class SampleSource(Protocol):
    """Where samples come from. `open` before the first call, `close` after the last."""

    def open(self) -> None: ...

    def close(self) -> None: ...

    def __call__(self) -> DashboardSample: ...
