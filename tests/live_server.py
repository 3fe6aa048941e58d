"""The real kinfer server on 127.0.0.1 (port 0) in a background thread, for end-to-end tests."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import httpx

from kinfer.config import Settings
from kinfer.runtime import Runtime
from kinfer.server.http import bind_socket, serve


@dataclass
class LiveServer:
    url: str  # http://127.0.0.1:PORT
    runtime: Runtime
    loop: asyncio.AbstractEventLoop
    shutdown: asyncio.Event | None = None
    thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def call(self, coro, timeout: float = 60):
        """Run a coroutine on the server's loop (to poke the scheduler from a test)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def begin_shutdown(self) -> None:
        """What SIGTERM does to `kinfer --headless`: drain, then stop serving."""
        assert self.shutdown is not None
        self.loop.call_soon_threadsafe(self.shutdown.set)

    def stopped(self, timeout: float) -> bool:
        """Wait (bounded) for the server to stop; True once it has."""
        assert self.thread is not None
        self.thread.join(timeout)
        return not self.thread.is_alive()


def server_settings(home: Path, **overrides) -> Settings:
    # one llama.cpp thread: ggml's spinning thread barrier collapses when a test's own threads take a core;
    # a short grace so that a test leaving a reply running does not hold its teardown for long
    base = Settings(home=home, port=0, keep_alive="-1", parallel=4, ctx=2048, threads=1, shutdown_grace=5.0)
    return replace(base, **overrides)


@contextmanager
def running_server(settings: Settings, *, engine_factory=None) -> Iterator[LiveServer]:
    runtime = Runtime.build(settings, engine_factory=engine_factory)
    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    loop = asyncio.new_event_loop()
    shutdown: asyncio.Event | None = None
    started = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        nonlocal shutdown
        asyncio.set_event_loop(loop)

        async def main() -> None:
            nonlocal shutdown
            shutdown = asyncio.Event()
            started.set()
            await serve(runtime, sock, shutdown)

        try:
            loop.run_until_complete(main())
        except BaseException as exc:  # surfaced to the test below
            failure.append(exc)
            started.set()
        finally:
            loop.close()

    thread = threading.Thread(target=run, name="kinfer-test-server", daemon=True)
    thread.start()
    started.wait(30)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        if failure:
            raise failure[0]
        try:
            if httpx.get(url + "/health", timeout=1).status_code in (200, 401):
                break
        except httpx.HTTPError:
            pass
        threading.Event().wait(0.05)
    try:
        yield LiveServer(url=url, runtime=runtime, loop=loop, shutdown=shutdown, thread=thread)
    finally:
        if shutdown is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: a test stopped the server already
                loop.call_soon_threadsafe(shutdown.set)
        thread.join(30)
        sock.detach()  # Hypercorn closed the fd already; closing it again could hit a reused number
