"""Server memory while a level runs: kinfer's `/metrics` gauges and the server process's RSS.

`kinfer_engine_memory_bytes{kind=...}` is the engine's memory account (weights, kv, state, pool,
scratch, cache, the allocator's total and peak: kinfer/engines/memory_account.py); RSS comes from
psutil when the server's PID is known (a server the bench started, or `--pid`). Peers without
`/metrics` simply report RSS only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

from kinfer.bench.clients import Target
from kinfer.bench.stats import MemoryPeak

log = logging.getLogger(__name__)

ENGINE_MEMORY_METRIC = "kinfer_engine_memory_bytes"
SAMPLE_INTERVAL_S = 0.5


def engine_memory(metrics_text: str) -> dict[str, int]:
    """Bytes by kind from a Prometheus text page, summed over models."""
    memory: dict[str, int] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name != ENGINE_MEMORY_METRIC:
            continue
        for sample in family.samples:
            kind = sample.labels.get("kind", "total")
            memory[kind] = memory.get(kind, 0) + int(sample.value)
    return memory


def process_rss(pid: int) -> int | None:
    """Resident bytes of `pid` and its children; None once the process is gone."""
    try:
        process = psutil.Process(pid)
        total = process.memory_info().rss
        for child in process.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                total += child.memory_info().rss
        return total
    except psutil.Error:
        return None


class MemoryProbe:
    """Samples a target's memory in the background and keeps the peaks."""

    def __init__(self, client: httpx.AsyncClient, target: Target, interval: float = SAMPLE_INTERVAL_S):
        self._client = client
        self._target = target
        self._interval = interval
        self._rss: int | None = None
        self._engine: dict[str, int] = {}
        self._at_peak: dict[str, int] = {}  # the whole account of the sample with the largest total
        self._metrics = True  # stop asking once the server shows it has no kinfer metrics
        self._task: asyncio.Task | None = None

    async def sample(self) -> None:
        """Take one sample now."""
        if self._target.pid is not None:
            rss = process_rss(self._target.pid)
            if rss is not None:
                self._rss = max(self._rss or 0, rss)
        if self._metrics:
            try:
                reply = await self._client.get(
                    self._target.url + "/metrics", headers=self._target.headers(), timeout=5
                )
                # a peer without kinfer's metrics is asked once, not every half second
                self._metrics = reply.status_code == 200 and "kinfer_" in reply.text
                memory = engine_memory(reply.text) if self._metrics else {}
            except (httpx.HTTPError, ValueError) as exc:
                log.debug("no metrics from %s: %s", self._target.url, exc)
                self._metrics, memory = False, {}
            for kind, value in memory.items():
                self._engine[kind] = max(self._engine.get(kind, 0), value)
            if memory.get("total", 0) > self._at_peak.get("total", 0):
                self._at_peak = memory

    async def _run(self) -> None:
        while True:
            await self.sample()
            await asyncio.sleep(self._interval)

    async def __aenter__(self) -> MemoryProbe:
        await self.sample()
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.sample()

    def peak(self) -> MemoryPeak:
        return MemoryPeak(rss_bytes=self._rss, engine_bytes=dict(self._engine), at_peak=dict(self._at_peak))
