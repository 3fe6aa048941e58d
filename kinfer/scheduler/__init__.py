"""Queue, admission, deadlines, cancellation and per-request streams; one engine thread per model."""

from kinfer.scheduler.scheduler import LoadedModel, Scheduler, SchedulerSnapshot, validate_request
from kinfer.scheduler.stream import RequestSnapshot, RequestStream

__all__ = [
    "LoadedModel",
    "RequestSnapshot",
    "RequestStream",
    "Scheduler",
    "SchedulerSnapshot",
    "validate_request",
]
