"""Reading the server from outside: Prometheus numbers, and waiting (bounded) for a state to arrive."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import httpx

from tests.live_server import LiveServer

SETTLE_S = 60.0  # how long a test waits for the server to settle before it fails (never a timing check)


def metric(text: str, name: str, **labels: str) -> float:
    """The value of `name{labels}` in a /metrics page; 0 when absent (counters start absent)."""
    for line in text.splitlines():
        match = re.match(rf"^{re.escape(name)}(?:\{{(.*)\}})? (\S+)$", line)
        if not match:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(match.group(2))
    return 0.0


def metrics(url: str) -> str:
    return httpx.get(url + "/metrics", timeout=10).text


def wait_until(check: Callable[[], bool], what: str, timeout: float = SETTLE_S) -> None:
    """Poll `check` until it holds; fail with `what` if it never does (a hang is a failure)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"gave up waiting for {what}")


def rows_busy(url: str) -> float:
    text = metrics(url)
    return sum(float(v) for v in re.findall(r"^kinfer_rows_busy\{[^}]*\} (\S+)$", text, re.M))


def live_streams(server: LiveServer) -> int:
    """Requests the scheduler still tracks (read on the server's own loop)."""

    async def count() -> int:
        return len(server.runtime.scheduler._streams)

    return server.call(count())
