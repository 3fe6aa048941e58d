"""Anthropic's keep-alive pings: silence yields a ping, and no event is lost to the wait."""

from __future__ import annotations

import asyncio

import pytest

from kinfer.protocol import Delta
from kinfer.server.anthropic import with_pings


@pytest.mark.asyncio
async def test_silence_gives_pings_and_the_interrupted_read_still_delivers():
    gate = asyncio.Event()

    async def events():
        yield Delta("a")
        await gate.wait()  # the model goes quiet until the test says so
        yield Delta("b")

    stream = with_pings(events(), interval=0.01)
    assert await anext(stream) == Delta("a")
    assert await anext(stream) is None  # nothing came within the interval: a ping
    assert await anext(stream) is None  # and another, while the same read keeps waiting
    gate.set()
    rest = [event async for event in stream if event is not None]
    assert rest == [Delta("b")]


@pytest.mark.asyncio
async def test_closing_the_stream_cancels_the_pending_read():
    finished = asyncio.Event()

    async def events():
        try:
            await asyncio.Event().wait()  # never answers
            yield Delta("never")
        finally:
            finished.set()

    stream = with_pings(events(), interval=0.01)
    assert await anext(stream) is None
    await stream.aclose()
    await asyncio.wait_for(finished.wait(), 5)
