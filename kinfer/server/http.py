"""Serving the app with Hypercorn on a socket bound beforehand.

    sock = bind_socket("127.0.0.1", 0)          # port 0 resolves now: print it, hand it to a test
    await serve(runtime, sock, shutdown)        # the scheduler runs while the app serves

Setting `shutdown` drains first: new requests get 503, replies in flight have --shutdown-grace seconds
to finish (`hurry` cuts that short), the rest end with their dialect's error event; then Hypercorn
closes the connections.

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


# after the drain, every reply has ended: this is only for their last bytes to go out
FLUSH_TIMEOUT_S = 3


async def serve(
    runtime: Runtime, sock: socket.socket, shutdown: asyncio.Event, hurry: asyncio.Event | None = None
) -> None:
    """Run Hypercorn on an already-bound socket until `shutdown` is set and the replies have drained."""
    config = Config()
    config.bind = [f"fd://{sock.fileno()}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.graceful_timeout = FLUSH_TIMEOUT_S
    config.keep_alive_timeout = 75
    config.h11_max_incomplete_size = 64 * 1024
    app = create_app(runtime)

    async def drained() -> None:
        # Hypercorn keeps accepting while this runs, so a request arriving now gets a real 503
        await shutdown.wait()
        await runtime.scheduler.drain(runtime.settings.shutdown_grace, hurry)

    await runtime.scheduler.start()
    try:
        await hypercorn_serve(app, config, shutdown_trigger=drained)
    finally:
        await runtime.scheduler.close()
