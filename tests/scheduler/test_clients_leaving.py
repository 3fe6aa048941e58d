"""Clients that leave while the engine thread works for them: the thread survives, nothing leaks,
and the metrics call them cancelled.

Every hand-off from the engine thread to a waiting caller (a token count, a model load) must hold
when the caller has gone: the engine thread, the other requests' replies and the loaded engine all
carry on. The engine is the scripted one, made slow where the test needs a caller to leave mid-way.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from kinfer.config import Settings
from kinfer.scheduler import Scheduler
from tests.scheduler.test_scheduler import ask, echo_reply, resolve
from tests.scripted_engine import ScriptedEngine

pytestmark = pytest.mark.asyncio

SLOW = "SLOW"  # a prompt holding this takes SLOW_S to tokenize (like a 2,500-token prefill's render)
SLOW_S = 0.4


class SlowTokenizing(ScriptedEngine):
    def tokenize(self, text: str) -> list[int]:
        if SLOW in text:
            time.sleep(SLOW_S)
        return super().tokenize(text)


def scheduler_with(factory, *, is_present=None, **overrides) -> Scheduler:
    """A scheduler over the test models whose engines `factory(model, settings, ctx)` makes."""
    settings = replace(Settings(home=Path("/tmp/unused"), keep_alive="-1"), **overrides)
    extra = {"is_present": is_present} if is_present is not None else {}
    return Scheduler(settings, resolve, factory, **extra)


def slow_scheduler(**overrides) -> tuple[Scheduler, list[ScriptedEngine]]:
    engines: list[ScriptedEngine] = []

    def factory(model, settings, ctx):
        engine = SlowTokenizing(echo_reply, name=model.name, step_delay=0.01)
        engines.append(engine)
        return engine

    return scheduler_with(factory, **overrides), engines


async def leave_after(coro, seconds: float) -> None:
    """Start `coro` as a client would, and hang up after `seconds`."""
    task = asyncio.create_task(coro)
    await asyncio.sleep(seconds)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def eventually(check, timeout: float = 5.0) -> None:
    """Wait (bounded) for `check()`; the assertions after it say what was expected."""
    deadline = time.monotonic() + timeout
    while not check() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


async def collect(stream) -> str:
    text, _thinking, _calls, done = await stream.collect()
    assert done.reason in ("stop", "length")
    return text


async def test_token_counters_that_hang_up_leave_the_engine_thread_and_other_replies_running():
    scheduler, engines = slow_scheduler()
    running = [await scheduler.submit(ask("r" * 200)) for _ in range(2)]
    # three clients ask for a count and hang up while the engine thread renders their prompts
    for _ in range(3):
        await leave_after(scheduler.count_tokens(ask(SLOW + " count me")), SLOW_S / 2)

    texts = await asyncio.wait_for(asyncio.gather(*(collect(s) for s in running)), 30)

    assert texts == ["r" * 200] * 2
    assert scheduler.loaded_models()[0].worker.alive
    assert await scheduler.count_tokens(ask("still counting?")) > 0
    await asyncio.wait_for(collect(await scheduler.submit(ask("next"))), 10)
    assert len(engines) == 1  # the same engine served everything: none was loaded twice
    snap = scheduler.snapshot()
    assert [r for r in snap.requests if r.finish is None] == []
    await scheduler.close()


async def test_a_client_that_leaves_while_its_model_loads_leaves_a_model_that_is_kept_not_leaked():
    engines: list[ScriptedEngine] = []
    loading = threading.Event()

    def slow_load(model, settings, ctx):
        loading.set()
        time.sleep(0.5)
        engine = ScriptedEngine(echo_reply, name=model.name)
        engines.append(engine)
        return engine

    scheduler = scheduler_with(slow_load)
    task = asyncio.create_task(scheduler.submit(ask("hello")))
    await asyncio.to_thread(loading.wait, 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    await eventually(lambda: bool(scheduler.loaded_models()))  # the load finishes without its requester
    assert [m.name for m in scheduler.loaded_models()] == ["alpha"]
    assert scheduler.loaded_models()[0].active == 0  # nobody pins it: its keep-alive runs
    text = await asyncio.wait_for(collect(await scheduler.submit(ask("again"))), 10)
    assert text == "niaga"
    assert len(engines) == 1 and not engines[0].closed  # the next request found it loaded
    await scheduler.close()
    assert engines[0].closed  # and unloading closed it


async def test_loads_whose_clients_all_leave_never_pile_up_engines():
    engines: list[ScriptedEngine] = []

    def slow_load(model, settings, ctx):
        time.sleep(0.2)
        engine = ScriptedEngine(echo_reply, name=model.name)
        engines.append(engine)
        return engine

    scheduler = scheduler_with(slow_load, max_loaded=1)
    for name in ("alpha", "beta", "alpha", "beta"):
        await leave_after(scheduler.submit(ask("hi", model=name)), 0.05)
        await eventually(lambda name=name: [m.name for m in scheduler.loaded_models()] == [name])
    live = [e for e in engines if not e.closed]
    assert len(live) == 1 and len(scheduler.loaded_models()) == 1  # every other engine was closed
    await scheduler.close()
    assert all(e.closed for e in engines)


async def test_a_client_that_leaves_before_its_prompt_is_ready_counts_as_cancelled():
    scheduler, _ = slow_scheduler()
    await scheduler.count_tokens(ask("load the model first"))
    for _ in range(3):
        await leave_after(scheduler.submit(ask(SLOW + " never mind")), SLOW_S / 2)

    snap = scheduler.snapshot()
    assert snap.outcomes == {"cancelled": 3}
    assert [r for r in snap.requests if r.finish is None] == []  # kinfer_requests_active is 0
    assert scheduler.loaded_models()[0].active == 0
    await scheduler.close()


async def test_an_unexpected_error_on_the_engine_thread_fails_its_replies_instead_of_hanging_them():
    class BrokenCancel(ScriptedEngine):
        def cancel(self, job_id: str) -> None:
            raise SystemError("a bug in the engine's bookkeeping")

    scheduler = scheduler_with(
        lambda model, s, ctx: BrokenCancel(echo_reply, name=model.name, step_delay=0.01)
    )
    doomed = await scheduler.submit(ask("d" * 300))
    other = await scheduler.submit(ask("o" * 300))
    while doomed.state == "queued":
        await asyncio.sleep(0.01)
    doomed.cancel()  # the engine thread trips over its own bug
    with pytest.raises(Exception, match="engine thread"):
        await asyncio.wait_for(other.collect(), 10)
    text = await asyncio.wait_for(collect(await scheduler.submit(ask("after"))), 10)
    assert text == "retfa"  # a fresh engine serves the next request
    await scheduler.close()
