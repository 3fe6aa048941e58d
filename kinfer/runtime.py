"""The composition root: builds the store, scheduler and metrics registry once, and passes them down.

The HTTP side is built over a runtime, never inside it: `server.app.create_app(runtime)` makes the
Quart app and `server.http.serve(runtime, sock, shutdown)` serves it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from kinfer.config import Settings
from kinfer.engines.loader import load_engine
from kinfer.errors import ModelNotFound
from kinfer.metrics import make_registry
from kinfer.request_log import RequestLog
from kinfer.scheduler import Scheduler
from kinfer.store.catalog import Store

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    """Everything a server process holds. Passed down; never a module global."""

    settings: Settings
    store: Store
    scheduler: Scheduler
    metrics_registry: CollectorRegistry | None = None
    requests: RequestLog = field(default_factory=RequestLog)  # every finished HTTP request
    cluster: Any = None  # distributed.cluster.Cluster on a distributed rank 0 (its ranks' health)

    @classmethod
    def build(cls, settings: Settings, *, engine_factory=None) -> Runtime:
        store = Store.from_settings(settings)

        def resolve(name: str | None):
            if name:
                return store.resolve(name)
            model = store.default_model(settings.model)
            if model is None:
                raise ModelNotFound("no model named and the store is empty: `kinfer pull OWNER/REPO` first")
            return model

        factory = engine_factory or (lambda model, s, ctx: load_engine(model, s, ctx=ctx))

        def is_present(model) -> bool:
            # `kinfer rm` in another process deletes the files under a loaded model
            path = getattr(model, "path", None)
            return path is None or path.exists()

        scheduler = Scheduler(settings, resolve, factory, is_present=is_present)
        runtime = cls(settings=settings, store=store, scheduler=scheduler)
        runtime.metrics_registry = make_registry(scheduler.snapshot)
        return runtime
