"""Queue, admission, deadlines, cancellation and per-request streams; one engine thread per model."""

from kinfer.scheduler.scheduler import LoadedModel, Scheduler, SchedulerSnapshot
from kinfer.scheduler.stream import RequestSnapshot, RequestStream

__all__ = [
    "LoadedModel",
    "RequestSnapshot",
    "RequestStream",
    "Scheduler",
    "SchedulerSnapshot",
]
