"""The same server `kinfer --headless` runs, as a task on the dashboard's event loop.

Running it on Textual's loop (rather than a thread of its own) lets the dashboard read
`scheduler.snapshot()` and call `scheduler.load()` directly: the scheduler is loop-bound.
The engines run on their own threads either way, so rendering never stalls a decode step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable

from kinfer.runtime import Runtime
from kinfer.server.http import serve

log = logging.getLogger(__name__)

STOP_SLACK_S = 15.0  # beyond --shutdown-grace: Hypercorn's flush and unloading the engines


class ServerTask:
    """Starts `kinfer.server.http.serve` on the running loop; `stop()` asks it to finish and waits."""

    def __init__(self, runtime: Runtime, sock: socket.socket) -> None:
        self.runtime = runtime
        self.sock = sock
        self.url = self._url(sock)
        self._shutdown: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    @staticmethod
    def _url(sock: socket.socket) -> str:
        host, port = sock.getsockname()[:2]
        host = "127.0.0.1" if host in ("0.0.0.0", "") else host
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self, on_exit: Callable[[BaseException | None], None] | None = None) -> None:
        """Serve in the background; `on_exit(error)` is called if the server stops by itself."""
        self._shutdown = asyncio.Event()
        self._task = asyncio.create_task(serve(self.runtime, self.sock, self._shutdown), name="kinfer-serve")

        def done(task: asyncio.Task) -> None:
            # Hypercorn's server closed the listening fd; forget it, so that closing (or collecting)
            # our socket object can never close whatever file reuses that number later
            self.sock.detach()
            if on_exit is None or self._shutdown is None or self._shutdown.is_set():
                return  # asked to stop: not news
            error = None if task.cancelled() else task.exception()
            on_exit(error)

        self._task.add_done_callback(done)

    async def stop(self, timeout: float | None = None) -> None:
        """Graceful, as `kinfer --headless` on SIGTERM: new requests get 503, replies in flight have
        --shutdown-grace seconds to finish, the rest end with their dialect's error event, then the
        engines unload."""
        if self._task is None or self._shutdown is None:
            return
        if timeout is None:
            timeout = self.runtime.settings.shutdown_grace + STOP_SLACK_S
        self._shutdown.set()
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout)
        except TimeoutError:
            log.warning("the server did not stop within %.0fs; cancelling it", timeout)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        except Exception:
            log.exception("the server stopped with an error")
        finally:
            self._task = None
