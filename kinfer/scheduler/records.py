"""What the scheduler keeps about each loaded model, and the snapshots it publishes.

The snapshots are built on the event loop and read by the dashboard and /metrics; `LoadedModel` is the
scheduler's own record of a model with a live engine thread.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from kinfer.config import Settings
from kinfer.engines.base import Engine, EngineStats, ModelInfo
from kinfer.scheduler.stream import RequestSnapshot
from kinfer.scheduler.worker import EngineWorker


class ModelRef(Protocol):
    """What the scheduler needs of a stored model (kinfer.store.models.StoredModel fits)."""

    name: str
    format: str
    size: int


class ModelResolver(Protocol):
    def __call__(self, name: str | None) -> ModelRef: ...


def model_key(model: ModelRef) -> str:
    """What identifies a model's weights, the key of the loaded models: the real path of what its engine
    loads, so an alias and its target (or two Ollama tags of one blob) share one engine, as Ollama keys
    its runners by the model file. A ref without a path (a test's) is known by its name."""
    path = getattr(model, "path", None)
    if path is None:
        return f"name:{model.name}"
    return f"{model.format}:{os.path.realpath(path)}"


EngineFactory = Callable[[ModelRef, Settings, int | None], Engine]
IsPresent = Callable[[ModelRef], bool]  # are the model's files still there (`kinfer rm` elsewhere)?


@dataclass
class LoadedModel:
    """A model with a live engine thread, shared by every name that reaches its files (`key`).

    `model` is the ref it was first loaded as: its name is the one /api/ps and the dashboard show.
    `names`: every name requests have asked it by, in order (the dashboard marks each)."""

    model: ModelRef
    key: str
    worker: EngineWorker
    info: ModelInfo
    loaded_at: float
    keep_alive: float
    active: int = 0
    last_used: float = field(default_factory=time.monotonic)
    expires_at: float | None = None  # monotonic deadline while idle; None = not idle or never
    load_seconds: float = 0.0
    removed: bool = False  # its files are gone: no new request reaches it, and it unloads when idle
    names: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.model.name not in self.names:
            self.names.insert(0, self.model.name)

    @property
    def name(self) -> str:
        return self.model.name


@dataclass(frozen=True)
class ModelSnapshot:
    name: str
    engine: str
    rows_total: int
    rows_busy: int
    waiting: int
    context_length: int
    size: int
    expires_in: float | None  # seconds until unload when idle; None = busy or never
    stats: EngineStats
    names: tuple[str, ...] = ()  # every name it was asked by (an alias and its target share one engine)


@dataclass(frozen=True)
class SchedulerSnapshot:
    """Everything the dashboard and /metrics read, built on the event loop."""

    taken_at: float
    models: tuple[ModelSnapshot, ...]
    requests: tuple[RequestSnapshot, ...]  # active first, then recently finished
    queue_depth: int
    outcomes: dict[str, int]
    prompt_tokens_total: int
    generated_tokens_total: int
    reused_tokens_total: int
    embedded_inputs_total: int = 0
    embedded_tokens_total: int = 0
