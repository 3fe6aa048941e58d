"""A request for n choices is one request to the scheduler: it waits until n rows are free at once,
keeps its place in the queue, counts once, and ends when every choice has."""

from __future__ import annotations

import asyncio

import pytest

from kinfer.errors import InvalidRequest
from kinfer.protocol import Done
from tests.scheduler.test_scheduler import ask, make_scheduler

pytestmark = pytest.mark.asyncio


async def test_a_request_for_n_choices_waits_for_n_free_rows_in_arrival_order():
    scheduler, engines = make_scheduler(engine_options={"rows": 3})
    first = await scheduler.submit(ask("a" * 60, n=2))
    second = await scheduler.submit(ask("b" * 20, n=3))  # needs every row: waits for the first
    third = await scheduler.submit(ask("c" * 5))  # one row would be free, but it came later
    order: list[str] = []

    async def finish(stream, label):
        choices = await stream.collect_choices()
        order.append(label)
        return [text for text, _thinking, _calls, _done in choices]

    texts = await asyncio.gather(finish(third, "third"), finish(second, "second"), finish(first, "first"))

    assert order == ["first", "second", "third"]
    assert texts == [["c" * 5], ["b" * 20] * 3, ["a" * 60] * 2]
    assert engines[0].max_busy == 3
    snapshot = scheduler.snapshot()
    assert snapshot.outcomes == {"stop": 3}  # three requests, six choices
    assert snapshot.generated_tokens_total == 5 + 3 * 20 + 2 * 60
    await scheduler.close()


async def test_cancelling_ends_every_choice_and_frees_their_rows():
    scheduler, _ = make_scheduler(engine_options={"rows": 4})
    stream = await scheduler.submit(ask("x" * 400, n=4))
    await stream.wait_for_row()

    stream.cancel()
    events = [event async for event in stream.events()]

    assert sorted(event.choice for event in events if isinstance(event, Done)) == [0, 1, 2, 3]
    assert stream.finish == "cancelled"
    after = await scheduler.submit(ask("after", n=4))  # all four rows are free again
    assert [text for text, *_ in await asyncio.wait_for(after.collect_choices(), 10)] == ["retfa"] * 4
    await scheduler.close()


async def test_more_choices_than_rows_is_refused():
    scheduler, _ = make_scheduler(engine_options={"rows": 2})
    with pytest.raises(InvalidRequest, match="n: "):
        await scheduler.submit(ask("hi", n=3))
    await scheduler.close()
