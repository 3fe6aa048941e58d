"""One request never hurts the others: the queue bound holds while a model loads, a request for a
second model neither blocks the loaded one nor waits past --queue-timeout, `keep_alive: 0` waits
for the replies in flight, and a model whose files were removed stops taking requests."""

from __future__ import annotations

import asyncio
import time

import pytest

from kinfer.errors import Busy, ModelNotFound
from kinfer.protocol import ErrorEvent
from tests.scheduler.test_clients_leaving import scheduler_with
from tests.scheduler.test_scheduler import ask, echo_reply, make_scheduler
from tests.scripted_engine import ScriptedEngine

pytestmark = pytest.mark.asyncio


async def collect(stream) -> str:
    text, _thinking, _calls, done = await stream.collect()
    assert done.reason in ("stop", "length"), done
    return text


async def test_the_queue_bound_holds_while_the_model_loads():
    def slow_load(model, settings, ctx):
        time.sleep(0.5)
        return ScriptedEngine(echo_reply, name=model.name)

    scheduler = scheduler_with(slow_load, max_queue=2)
    results = await asyncio.gather(
        *(scheduler.submit(ask(f"q{i}")) for i in range(20)), return_exceptions=True
    )

    admitted = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, Busy)]
    assert (len(admitted), len(refused)) == (2, 18)  # two wait for the load; the rest are told at once
    assert all(r.retry_after and r.retry_after >= 1 for r in refused)
    assert scheduler.snapshot().outcomes == {"rejected": 18}
    for stream in admitted:
        await collect(stream)
    await scheduler.close()


async def test_a_request_for_a_second_model_neither_blocks_the_loaded_one_nor_waits_forever():
    scheduler, _ = make_scheduler(max_loaded=1, queue_timeout=1.0, engine_options={"step_delay": 0.01})
    long = await scheduler.submit(ask("l" * 3000, model="alpha"))  # alpha stays busy for ~30 s
    beta = asyncio.create_task(scheduler.submit(ask("for beta", model="beta")))
    await asyncio.sleep(0.1)  # beta now waits for alpha to go idle

    started = time.monotonic()
    text = await asyncio.wait_for(collect(await scheduler.submit(ask("4tok", model="alpha"))), 10)
    assert text == "kot4"
    assert time.monotonic() - started < 5  # a free row on the loaded model is used at once

    with pytest.raises(Busy, match="before loading beta"):
        await asyncio.wait_for(beta, 10)  # --queue-timeout bounds the wait for room too
    assert [m.name for m in scheduler.loaded_models()] == ["alpha"]
    long.cancel()
    await scheduler.close()


async def test_the_second_model_loads_once_the_first_is_idle():
    scheduler, engines = make_scheduler(max_loaded=1, engine_options={"step_delay": 0.005})
    first = await scheduler.submit(ask("a" * 40, model="alpha"))
    beta = asyncio.create_task(scheduler.submit(ask("b", model="beta")))
    assert await collect(first) == "a" * 40
    assert await asyncio.wait_for(collect(await beta), 10) == "b"
    assert [m.name for m in scheduler.loaded_models()] == ["beta"] and engines[0].closed
    await scheduler.close()


async def test_keep_alive_zero_waits_for_the_replies_in_flight():
    scheduler, engines = make_scheduler(engine_options={"step_delay": 0.005})
    await scheduler.start()
    running = await scheduler.submit(ask("k" * 200))
    assert await scheduler.unload_when_idle("alpha")  # another client's `keep_alive: 0`

    assert await collect(running) == "k" * 200  # the reply finished whole
    # the model leaves the list, then its engine thread closes the engine a moment later: wait for both
    for _ in range(100):
        if not scheduler.loaded_models() and engines[0].closed:
            break
        await asyncio.sleep(0.05)
    assert scheduler.loaded_models() == [] and engines[0].closed  # then the model unloaded
    await scheduler.close()


async def test_keep_alive_zero_unloads_an_idle_model_at_once():
    scheduler, engines = make_scheduler()
    await collect(await scheduler.submit(ask("x")))
    assert await scheduler.unload_when_idle("alpha")
    assert scheduler.loaded_models() == [] and engines[0].closed
    assert not await scheduler.unload_when_idle("alpha")
    await scheduler.close()


async def test_a_model_whose_files_are_gone_takes_no_new_request_and_unloads_when_idle():
    present = {"alpha": True}
    engines: list[ScriptedEngine] = []

    def factory(model, settings, ctx):
        engines.append(ScriptedEngine(echo_reply, name=model.name, step_delay=0.005))
        return engines[-1]

    scheduler = scheduler_with(factory, is_present=lambda model: present.get(model.name, True))
    running = await scheduler.submit(ask("r" * 100))
    present["alpha"] = False  # `kinfer rm alpha` in another process

    await scheduler.forget_removed()
    assert [m.name for m in scheduler.loaded_models()] == ["alpha"]  # busy: its reply goes on
    with pytest.raises(ModelNotFound, match="removed"):
        await scheduler.submit(ask("more"))
    assert await collect(running) == "r" * 100
    await scheduler.forget_removed()
    assert scheduler.loaded_models() == [] and engines[0].closed


async def test_draining_refuses_new_requests_and_ends_the_late_ones_with_an_error():
    scheduler, _ = make_scheduler(engine_options={"rows": 1, "step_delay": 0.005})
    quick = await scheduler.submit(ask("q" * 20))
    slow = await scheduler.submit(ask("s" * 3000))  # waits for the row, then runs ~15 s
    drain = asyncio.create_task(scheduler.drain(grace=1.0))
    await asyncio.sleep(0.05)
    with pytest.raises(Busy, match="shutting down"):
        await scheduler.submit(ask("new"))

    assert await collect(quick) == "q" * 20  # finished within the grace period
    events = [e async for e in slow.events()]
    assert isinstance(events[-1], ErrorEvent) and isinstance(events[-1].error, Busy)
    await asyncio.wait_for(drain, 5)
    assert scheduler.snapshot().requests[0].finish is not None
    await scheduler.close()
