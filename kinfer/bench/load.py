"""The load generator: many concurrent requests spread over client processes, as many users would send them.

One Python process cannot play 256 users. With 256 streams on one `httpx.AsyncClient`, the client's
own connection pool (httpcore scans every connection each time a request starts or a stream closes)
and its event loop parsing every streamed chunk took more CPU than the servers it measured: on the
H200 the 256th request left the client ~2 s after the first, and the first response headers of a
256-stream burst arrived 3 s in, before the server had seen most of the requests (docs/benchmarks.md,
"H200, fifth session"). So above `STREAMS_PER_CLIENT` streams the work is split over client processes,
each with its own event loop, connection pool and share of the streams; they start sending together,
once every one of them is up. Request times are `time.perf_counter()`, the system's monotonic clock on
Linux and macOS, so a level's wall time may span processes (first request sent to last reply).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import multiprocessing
import queue
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import httpx

Item = TypeVar("Item")
Result = TypeVar("Result")
# a module-level async function (it travels to the client processes by name) and one item of work
Job = Callable[[httpx.AsyncClient, Item], Awaitable[Result]]

STREAMS_PER_CLIENT = 32  # one client process keeps up with this many streams of a fast server
DEFAULT_TIMEOUT_S = 600.0
START_TIMEOUT_S = 120.0  # client processes importing httpx on a busy machine


def make_client(max_streams: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> httpx.AsyncClient:
    """A client with a connection for every concurrent stream plus the memory probe."""
    limits = httpx.Limits(max_connections=max_streams + 8, max_keepalive_connections=max_streams + 8)
    return httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(timeout_s, connect=30.0))


def client_count(concurrency: int) -> int:
    """How many client processes `concurrency` streams are spread over (1: the calling process)."""
    return max(1, math.ceil(concurrency / STREAMS_PER_CLIENT))


def shares(items: Sequence[Item], concurrency: int, clients: int) -> list[tuple[list[Item], int]]:
    """Each client's items (dealt round-robin, so early and late requests mix) and its concurrency;
    the concurrencies add up to `concurrency`."""
    share = [concurrency // clients + (i < concurrency % clients) for i in range(clients)]
    return [(list(items[i::clients]), share[i]) for i in range(clients)]


async def send_all(
    job: Job, items: Sequence[Item], *, concurrency: int, timeout_s: float = DEFAULT_TIMEOUT_S
) -> list[Result]:
    """`job` over every item, at most `concurrency` at once, spread over `client_count` processes.

    Results come back grouped by client process, not in `items`' order."""
    clients = client_count(concurrency)
    if clients == 1:
        return await _send_share(job, list(items), concurrency, timeout_s)
    return await asyncio.to_thread(_send_from_processes, job, items, concurrency, clients, timeout_s)


def _send_from_processes(
    job: Job, items: Sequence[Item], concurrency: int, clients: int, timeout_s: float
) -> list[Result]:
    # spawn, not fork: the caller may run threads (a server under test, a dashboard)
    context = multiprocessing.get_context("spawn")
    ready = context.Barrier(clients + 1)
    results = context.Queue()
    processes = [
        context.Process(
            target=_client_process,
            args=(job, share, share_concurrency, timeout_s, ready, results),
            daemon=True,
        )
        for share, share_concurrency in shares(items, concurrency, clients)
    ]
    for process in processes:
        process.start()
    try:
        # every process has done its imports and holds its client before the first request goes out
        with contextlib.suppress(threading.BrokenBarrierError):
            ready.wait(timeout=START_TIMEOUT_S)  # broken: a client failed first; its error is queued
        parts = [_next_part(results, processes) for _ in processes]
    finally:
        for process in processes:
            process.join(timeout=5)
            if process.is_alive():
                process.terminate()
    return [result for part in parts for result in part]


def _next_part(results, processes: list) -> list:
    """The next client process's results; raises if one failed or died without sending any."""
    while True:
        try:
            ok, part = results.get(timeout=1.0)
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in processes):
                raise RuntimeError("a client process died before it sent its results") from None
            continue
        if not ok:
            raise RuntimeError(f"a client process failed: {part}")
        return part


def _client_process(job: Job, items: list, concurrency: int, timeout_s: float, ready, results) -> None:
    try:
        part = asyncio.run(_send_share(job, items, concurrency, timeout_s, ready=ready))
    except BaseException as exc:  # the parent raises it: a client that fails must not pass for a slow one
        ready.abort()  # nobody waits for this client to start
        results.put((False, f"{type(exc).__name__}: {exc}"))
    else:
        results.put((True, part))


async def _send_share(
    job: Job, items: list[Item], concurrency: int, timeout_s: float, *, ready=None
) -> list[Result]:
    gate = asyncio.Semaphore(concurrency)

    async def one(item: Item) -> Result:
        async with gate:
            return await job(client, item)

    async with make_client(concurrency, timeout_s) as client:
        if ready is not None:
            ready.wait(timeout=START_TIMEOUT_S)  # nothing else runs on this loop yet: blocking is fine
        return list(await asyncio.gather(*(one(item) for item in items)))
