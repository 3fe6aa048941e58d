"""A long prompt arriving while rows stream does not stop them: its prefill is cut into chunks that
fit the step time budget (engines/prefill_budget.py). Real llama.cpp on the bundled SmolLM2."""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from dataclasses import replace
from pathlib import Path

import pytest

from kinfer.config import Settings
from kinfer.engines.llama.engine import LlamaEngine
from kinfer.protocol import ChatRequest, Delta, Message
from kinfer.scheduler import Scheduler
from kinfer.scheduler.stream import RequestStream
from tests.scheduler.test_scheduler import resolve

pytestmark = pytest.mark.asyncio

# ~1,000 tokens of SmolLM2: several seconds of prefill on one CPU thread
LONG_PROMPT = "Here is a list to remember. " + " ".join(
    f"Item {i} is a {('red', 'blue')[i % 2]} box." for i in range(130)
)


class Stamps:
    """When each text delta of a stream arrived."""

    def __init__(self, stream: RequestStream) -> None:
        self.times: list[float] = []
        self.task = asyncio.create_task(self._read(stream))

    async def _read(self, stream: RequestStream) -> None:
        async for event in stream.events():
            if isinstance(event, Delta):
                self.times.append(time.monotonic())


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


async def test_a_long_prompt_does_not_stop_the_rows_streaming(smollm2_gguf: Path):
    def factory(model, _settings, _ctx):
        return LlamaEngine(smollm2_gguf, name=model.name, rows=3, ctx=2048, threads=1, prefix_cache=False)

    scheduler = Scheduler(replace(Settings(home=Path("/tmp/unused")), keep_alive="-1"), resolve, factory)
    story = ChatRequest(
        model="alpha", messages=(Message("user", "Tell me a long story."),), max_tokens=1500, ignore_eos=True
    )
    rows = [Stamps(await scheduler.submit(story)) for _ in range(2)]
    while min(len(row.times) for row in rows) < 20:  # both rows stream at their own pace
        await asyncio.sleep(0.01)

    arrived = time.monotonic()
    long = await scheduler.submit(ChatRequest(model="alpha", raw_prompt=LONG_PROMPT, max_tokens=2))
    assert long.prompt_tokens > 800
    first = Stamps(long)
    await first.task
    answered = first.times[0]
    await asyncio.sleep(0.3)  # the rows' next tokens close the last gap
    for task in (row.task for row in rows):
        task.cancel()

    usual = statistics.median(g for row in rows for g in gaps([t for t in row.times if t < arrived]))
    # gaps that end after the long prompt came (one spanning its arrival whole), none from before it
    largest = max(b - a for row in rows for a, b in itertools.pairwise(row.times) if b > arrived)
    prefill = answered - arrived
    # one step holding the whole prefill would make the largest gap about as long as the prefill
    assert largest <= max(20 * usual, prefill / 4), (largest, usual, prefill)
    await scheduler.close()
