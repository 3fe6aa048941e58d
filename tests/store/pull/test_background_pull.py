"""`BackgroundPull`: a pull on a worker thread whose progress arrives on the asyncio loop (what
`/api/pull` and the dashboard run), against the fake Hub."""

from __future__ import annotations

import asyncio
import fcntl
import os
import threading

import pytest

from kinfer.errors import ModelNotFound
from kinfer.store.background_pull import BackgroundPull
from kinfer.store.catalog import Store
from kinfer.store.progress import PullProgress
from tests.fixtures.hub_server import FakeRepo, HubServer
from tests.store.pull.conftest import RESUMABLE_VOCAB

pytestmark = pytest.mark.asyncio

NAME = "hf.co/o/Tiny-GGUF:q4_k_m"


def model_lock_held(store: Store, name: str) -> bool:
    """Whether a pull of `name` still holds its per-model lock."""
    fd = os.open(store.partial_dir / f"{store.slug_for(name)}.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


async def test_progress_arrives_on_the_loop_and_the_model_is_installed(
    hub: HubServer, store: Store, gguf_bytes
) -> None:
    hub.repos["o/Tiny-GGUF"] = FakeRepo({"m-Q4_K_M.gguf": gguf_bytes()})
    loop_thread = threading.get_ident()
    pulling = BackgroundPull(store, "o/Tiny-GGUF")
    events: list[PullProgress] = []
    threads: set[int] = set()
    async for event in pulling.events():
        events.append(event)
        threads.add(threading.get_ident())
    assert threads == {loop_thread}
    assert events[0].phase == "resolving" and events[-1].phase == "success"
    assert any(e.phase == "downloading" for e in events)
    assert pulling.model is not None and pulling.model.name == NAME
    assert [m.name for m in store.list()] == [NAME]


async def test_what_the_pull_raised_is_raised_on_the_loop(hub: HubServer, store: Store) -> None:
    pulling = BackgroundPull(store, "nobody/nothing")
    with pytest.raises(ModelNotFound):
        async for _ in pulling.events():
            pass
    assert pulling.model is None


async def test_leaving_early_cancels_the_pull_and_waits_for_its_thread(
    hub: HubServer, store: Store, gguf_bytes
) -> None:
    data = gguf_bytes("F32", n_vocab=RESUMABLE_VOCAB)
    hub.repos["o/Slow-GGUF"] = FakeRepo({"m-Q4_K_M.gguf": data})
    hub.throttle(len(data) / 5)  # about 5 s, if it were left to finish
    pulling = BackgroundPull(store, "o/Slow-GGUF")
    events = pulling.events()
    async for event in events:
        if event.phase == "downloading" and event.completed > 0:
            break
    await events.aclose()  # what a closed /api/pull stream does
    assert pulling.cancel.is_set()
    assert not model_lock_held(store, "hf.co/o/Slow-GGUF:q4_k_m")  # the thread has let go already
    assert [m.name for m in store.list()] == []
    partial = [p for p in store.partial_dir.rglob("*.part") if p.stat().st_size]
    assert partial, "the bytes fetched so far stay for the next pull to resume"


async def test_a_cancelled_consumer_cancels_the_pull(hub: HubServer, store: Store, gguf_bytes) -> None:
    data = gguf_bytes("F32", n_vocab=RESUMABLE_VOCAB)
    hub.repos["o/Slow-GGUF"] = FakeRepo({"m-Q4_K_M.gguf": data})
    hub.throttle(len(data) / 5)
    pulling = BackgroundPull(store, "o/Slow-GGUF")
    started = asyncio.Event()

    async def consume() -> None:
        async for event in pulling.events():
            if event.phase == "downloading":
                started.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(started.wait(), 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert pulling.cancel.is_set()
    assert [m.name for m in store.list()] == []
