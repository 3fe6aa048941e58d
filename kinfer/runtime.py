"""The composition root: builds the store, scheduler, metrics and the Quart app once, and serves them."""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from kinfer.config import Settings
from kinfer.engines.loader import load_engine
from kinfer.metrics import make_registry
from kinfer.scheduler import Scheduler
from kinfer.store.catalog import Store

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    """Everything a server process holds. Passed down; never a module global."""

    settings: Settings
    store: Store
    scheduler: Scheduler
    extras: dict[str, object] = field(default_factory=dict)  # per-dialect state (e.g. stored responses)
    metrics_registry: CollectorRegistry | None = None

    @classmethod
    def build(cls, settings: Settings, *, engine_factory=None) -> Runtime:
        store = Store.from_settings(settings)

        def resolve(name: str | None):
            if name:
                return store.resolve(name)
            model = store.default_model(settings.model)
            if model is None:
                from kinfer.errors import ModelNotFound

                raise ModelNotFound("no model named and the store is empty: `kinfer pull OWNER/REPO` first")
            return model

        factory = engine_factory or (lambda model, s, ctx: load_engine(model, s, ctx=ctx))
        scheduler = Scheduler(settings, resolve, factory)
        runtime = cls(settings=settings, store=store, scheduler=scheduler)
        runtime.metrics_registry = make_registry(scheduler.snapshot)
        return runtime

    def create_app(self):
        from kinfer.server.app import create_app

        return create_app(self)


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind before serving so port 0 resolves to a real port we can print and hand to tests."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(512)
    sock.setblocking(False)
    return sock


async def serve(runtime: Runtime, sock: socket.socket, shutdown: asyncio.Event) -> None:
    """Run Hypercorn on an already-bound socket until `shutdown` is set."""
    from hypercorn.asyncio import serve as hypercorn_serve
    from hypercorn.config import Config

    config = Config()
    config.bind = [f"fd://{sock.fileno()}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.graceful_timeout = 3
    config.keep_alive_timeout = 75
    config.h11_max_incomplete_size = 64 * 1024
    app = runtime.create_app()
    await runtime.scheduler.start()
    try:
        await hypercorn_serve(app, config, shutdown_trigger=shutdown.wait)
    finally:
        await runtime.scheduler.close()
