"""What a model's load leaves alive is frozen out of the collector's full passes (scheduler/heap.py):
a full pass mid-stream walks only what came after (88 ms over ~123,000 objects on this VM otherwise,
on whichever thread allocated next). An unload thaws and collects, so the model's own reference cycles
go with it."""

from __future__ import annotations

import asyncio
import gc
import weakref
from dataclasses import replace
from pathlib import Path

import pytest

from kinfer.config import Settings
from kinfer.scheduler import Scheduler
from tests.scheduler.test_scheduler import answer, ask, echo_reply, resolve
from tests.scripted_engine import ScriptedEngine

pytestmark = pytest.mark.asyncio


class Cycle:
    """Garbage only the cyclic collector can free (it refers to itself)."""

    def __init__(self) -> None:
        self.me = self


async def test_a_loaded_model_is_frozen_out_of_full_passes_and_its_cycles_leave_with_it():
    gc.unfreeze()
    held: list[weakref.ref] = []

    def factory(model, settings, ctx):
        engine = ScriptedEngine(echo_reply, name=model.name)
        engine.cycle = Cycle()  # a model's own cycle, alive as long as the engine
        held.append(weakref.ref(engine.cycle))
        return engine

    settings = replace(Settings(home=Path("/tmp/unused"), keep_alive="-1"))
    scheduler = Scheduler(settings, resolve, factory)
    await scheduler.start()
    try:
        await answer(scheduler, ask("stay"))
        frozen = gc.get_freeze_count()
        assert frozen > 0 and len(gc.get_objects()) < frozen  # a full pass walks less than is frozen
        assert held[0]() is not None

        await answer(scheduler, ask("go", keep_alive=0))  # unloads once idle
        for _ in range(100):
            if not scheduler.loaded_models() and held[0]() is None:
                break
            await asyncio.sleep(0.1)
        assert scheduler.loaded_models() == []
        assert held[0]() is None  # thawed and collected, not kept frozen
    finally:
        await scheduler.close()
        gc.unfreeze()
