"""An alias and the model it names share one engine (Ollama keys its runners by the model file), and
every reply names the model the way its request asked for it."""

from __future__ import annotations

import asyncio

import pytest

from tests.scheduler.test_scheduler import MODELS, answer, ask, make_scheduler

pytestmark = pytest.mark.asyncio


async def reply_model(scheduler, model: str) -> str:
    stream = await scheduler.submit(ask("hello", model=model))
    await stream.collect()
    return stream.model


async def test_the_alias_then_the_real_name_load_the_model_once_and_each_reply_echoes_its_name():
    scheduler, engines = make_scheduler(max_loaded=2)
    assert await reply_model(scheduler, "my-alpha") == "my-alpha"
    assert await reply_model(scheduler, "alpha") == "alpha"
    assert await reply_model(scheduler, "my-alpha") == "my-alpha"

    assert len(engines) == 1
    [loaded] = scheduler.loaded_models()
    assert loaded.name == "my-alpha"  # /api/ps names it as it was first loaded, as Ollama does
    assert scheduler.snapshot().models[0].names == ("my-alpha", "alpha")
    await scheduler.close()


async def test_the_alias_and_the_real_name_asked_at_once_share_one_load():
    scheduler, engines = make_scheduler(max_loaded=2)
    streams = await asyncio.gather(*(scheduler.submit(ask("hi", model=m)) for m in ("alpha", "my-alpha")))
    for stream in streams:
        await stream.collect()
    assert [s.model for s in streams] == ["alpha", "my-alpha"]
    assert len(engines) == 1 and len(scheduler.loaded_models()) == 1
    await scheduler.close()


async def test_two_different_models_still_load_separately():
    scheduler, engines = make_scheduler(max_loaded=2)
    assert await reply_model(scheduler, "alpha") == "alpha"
    assert await reply_model(scheduler, "beta") == "beta"
    assert len(engines) == 2
    assert sorted(m.name for m in scheduler.loaded_models()) == ["alpha", "beta"]
    await scheduler.close()


async def test_keep_alive_zero_through_the_alias_unloads_the_shared_model():
    scheduler, engines = make_scheduler()
    await answer(scheduler, ask("stay", model="alpha"))
    assert await scheduler.unload_when_idle("my-alpha")
    assert scheduler.loaded_models() == [] and engines[0].closed

    await scheduler.start()  # the keep-alive reaper
    await answer(scheduler, ask("again", model="alpha"))
    await answer(scheduler, ask("go", model="my-alpha", keep_alive=0))  # a request's own keep_alive: 0
    for _ in range(100):
        if not scheduler.loaded_models() and engines[1].closed:
            break
        await asyncio.sleep(0.05)
    assert scheduler.loaded_models() == [] and engines[1].closed
    assert len(engines) == 2
    await scheduler.close()


async def test_an_empty_load_through_either_name_finds_the_loaded_model(monkeypatch: pytest.MonkeyPatch):
    scheduler, engines = make_scheduler()
    model = await scheduler.load("my-alpha")
    assert model.name == "my-alpha"  # what an empty /api/generate or /api/embed echoes
    assert scheduler.find_loaded("alpha") is scheduler.find_loaded("my-alpha") is not None
    assert (await scheduler.load("alpha")).name == "alpha" and len(engines) == 1

    monkeypatch.delitem(MODELS, "my-alpha")  # the alias is deleted: the name it was loaded by still works
    assert await scheduler.unload("my-alpha")
    assert scheduler.loaded_models() == [] and engines[0].closed
    await scheduler.close()
