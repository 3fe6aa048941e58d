"""Serving the app with Hypercorn on a socket bound beforehand.

    sock = bind_socket("127.0.0.1", 0)          # port 0 resolves now: print it, hand it to a test
    await serve(runtime, sock, shutdown)        # the scheduler runs while the app serves

`kinfer --headless`, the dashboard's server task and the end-to-end tests all serve through here.
"""

from __future__ import annotations

import asyncio
import logging
import socket

from hypercorn.asyncio import serve as hypercorn_serve
from hypercorn.config import Config

from kinfer.runtime import Runtime
from kinfer.server.app import create_app


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
    config = Config()
    config.bind = [f"fd://{sock.fileno()}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.graceful_timeout = 3
    config.keep_alive_timeout = 75
    config.h11_max_incomplete_size = 64 * 1024
    app = create_app(runtime)
    await runtime.scheduler.start()
    try:
        await hypercorn_serve(app, config, shutdown_trigger=shutdown.wait)
    finally:
        await runtime.scheduler.close()
