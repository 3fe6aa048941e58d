"""Scheduler invariants, on the scripted engine (the real protocol, output chosen by the test)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from kinfer.config import Settings
from kinfer.engines.base import JobUpdate
from kinfer.errors import Busy, EngineFailure, InvalidRequest, ModelNotFound, PromptTooLong
from kinfer.protocol import ChatRequest, Delta, Done, ErrorEvent, Message
from kinfer.scheduler import Scheduler
from kinfer.scheduler.stream import RequestStream
from tests.scripted_engine import ScriptedEngine

pytestmark = pytest.mark.asyncio


@dataclass(frozen=True)
class FakeModel:
    name: str
    format: str = "gguf"
    size: int = 1
    path: Path = Path("/nonexistent")


# models are told apart by their files: "my-alpha" is an alias of alpha (/api/copy), the same weights
MODELS = {
    "alpha": FakeModel("alpha", path=Path("/models/alpha.gguf")),
    "my-alpha": FakeModel("my-alpha", path=Path("/models/alpha.gguf")),
    "beta": FakeModel("beta", path=Path("/models/beta.gguf")),
}


def resolve(name: str | None) -> FakeModel:
    if name is None:
        return MODELS["alpha"]
    if name not in MODELS:
        raise ModelNotFound(f"model {name!r} not found")
    return MODELS[name]


def echo_reply(prompt: str) -> str:
    """Reply with the last user message reversed: each reply is distinct and checkable."""
    last = prompt.rsplit("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
    return last[::-1]


def make_scheduler(engine_options: dict | None = None, **overrides) -> tuple[Scheduler, list[ScriptedEngine]]:
    settings = replace(Settings(home=Path("/tmp/unused"), keep_alive="-1"), **overrides)
    engines: list[ScriptedEngine] = []
    options = engine_options or {}

    def factory(model, settings, ctx):
        engine = ScriptedEngine(echo_reply, name=model.name, **options)
        engines.append(engine)
        return engine

    return Scheduler(settings, resolve, factory), engines


def ask(text: str, model: str = "alpha", **kwargs) -> ChatRequest:
    return ChatRequest(model=model, messages=(Message("user", text),), **kwargs)


async def answer(scheduler: Scheduler, request: ChatRequest) -> tuple[str, Done]:
    stream = await scheduler.submit(request)
    text, _thinking, _calls, done = await stream.collect()
    return text, done


async def test_concurrent_requests_share_the_batch_and_keep_their_own_text():
    scheduler, engines = make_scheduler()
    prompts = [f"question number {i}" for i in range(8)]
    results = await asyncio.gather(*(answer(scheduler, ask(p)) for p in prompts))
    for prompt, (text, done) in zip(prompts, results, strict=True):
        assert text == prompt[::-1]
        assert done.reason == "stop"
        assert done.usage.completion_tokens == len(prompt)
        assert done.usage.prompt_tokens > len(prompt)
    assert engines[0].max_busy == 4  # 4 rows, 8 requests: the batch was full
    await scheduler.close()


async def test_requests_wait_in_arrival_order_when_rows_are_full():
    scheduler, _ = make_scheduler(engine_options={"rows": 1})
    first = await scheduler.submit(ask("a" * 40))
    second = await scheduler.submit(ask("second"))
    third = await scheduler.submit(ask("third"))
    assert scheduler.queue_depth() >= 1
    order: list[str] = []

    async def finish(stream, label):
        await stream.collect()
        order.append(label)

    await asyncio.gather(finish(third, "third"), finish(second, "second"), finish(first, "first"))
    assert order == ["first", "second", "third"]
    await scheduler.close()


async def test_cancel_frees_the_row_for_the_next_request():
    scheduler, engines = make_scheduler(engine_options={"rows": 1})
    long = await scheduler.submit(ask("x" * 2000))
    waiting = await scheduler.submit(ask("next"))
    async for event in long.events():
        if isinstance(event, Delta):
            break
    long.cancel()
    text, done = await asyncio.wait_for(_collect(waiting), 10)
    assert text == "txen" and done.reason == "stop"
    assert long.finish == "cancelled"
    assert engines[0].stats().rows_busy == 0
    await scheduler.close()


async def _collect(stream):
    text, _t, _c, done = await stream.collect()
    return text, done


async def test_a_full_queue_answers_busy_with_a_retry_hint():
    scheduler, _ = make_scheduler(max_queue=2, engine_options={"rows": 1})
    streams = [await scheduler.submit(ask("y" * 500))]
    while streams[0].state == "queued":  # the first takes the only row
        await asyncio.sleep(0.005)
    streams += [await scheduler.submit(ask("y" * 500)) for _ in range(2)]
    with pytest.raises(Busy) as refused:
        await scheduler.submit(ask("one too many"))
    assert refused.value.retry_after and refused.value.retry_after >= 1
    for stream in streams:
        stream.cancel()
    await scheduler.close()


async def test_a_prompt_that_cannot_fit_is_refused_before_streaming():
    scheduler, _ = make_scheduler(engine_options={"ctx": 64})
    with pytest.raises(PromptTooLong, match="64"):
        await scheduler.submit(ask("z" * 200))
    text, _ = await answer(scheduler, ask("short"))
    assert text == "trohs"
    await scheduler.close()


async def test_max_tokens_is_clipped_to_the_row_and_reported_as_length():
    scheduler, _ = make_scheduler(engine_options={"ctx": 100})
    text, done = await answer(scheduler, ask("q" * 30, max_tokens=5))
    assert done.reason == "length" and len(text) == 5
    # the prompt takes 80 of the row's 100 tokens: a 30-token reply is cut at 20
    text, done = await answer(scheduler, ask("q" * 30, max_tokens=1000))
    assert done.reason == "length" and len(text) == 20
    await scheduler.close()


async def test_an_unknown_model_is_not_found():
    scheduler, _ = make_scheduler()
    with pytest.raises(ModelNotFound):
        await scheduler.submit(ask("hi", model="gamma"))
    await scheduler.close()


@pytest.mark.parametrize(
    ("chat_request", "message"),
    [
        # what /v1/completions sends (a raw prompt, no messages): it used to reach the engine unchecked
        (
            ChatRequest(model="alpha", raw_prompt="Once upon a time", max_tokens=0),
            "max_tokens must be at least 1",
        ),
        (ChatRequest(model="alpha", max_tokens=0), "messages must not be empty"),
        (ask("hi", max_tokens=-3), "max_tokens must be at least 1"),
    ],
)
async def test_every_request_is_checked_before_a_model_loads(chat_request: ChatRequest, message: str):
    scheduler, engines = make_scheduler()
    with pytest.raises(InvalidRequest, match=message):
        await scheduler.submit(chat_request)
    with pytest.raises(InvalidRequest, match=message):
        await scheduler.count_tokens(chat_request)
    assert engines == [] and scheduler.loaded_models() == []
    await scheduler.close()


async def test_the_stop_string_that_ended_a_reply_reaches_done():
    scheduler, _ = make_scheduler()
    text, done = await answer(scheduler, ask("one two three", stop=("xyz", "owt")))
    assert text == "eerht "  # the reply is the question reversed: "eerht owt eno"
    assert (done.reason, done.stop_string) == ("stop", "owt")
    assert done.usage.completion_tokens == len("eerht owt")  # nothing counted after the stop
    _, plain = await answer(scheduler, ask("no stop here", stop=("xyz",)))
    assert (plain.reason, plain.stop_string) == ("stop", None)
    await scheduler.close()


async def test_an_engine_refusing_a_job_keeps_the_errors_status():
    scheduler, _ = make_scheduler(engine_options={"refuse_on": "REFUSE"})
    refused = await scheduler.submit(ask("REFUSE this"))
    with pytest.raises(InvalidRequest) as caught:  # a 400 stays a 400, not an engine failure's 500
        await refused.collect()
    assert caught.value.status == 400
    text, _ = await answer(scheduler, ask("fine"))
    assert text == "enif"
    await scheduler.close()


async def test_an_engine_fault_fails_running_rows_and_the_model_keeps_serving():
    scheduler, engines = make_scheduler(engine_options={"fail_on": "BOOM"})
    doomed = await scheduler.submit(ask("MOOB please"))
    events = [e async for e in doomed.events()]
    assert isinstance(events[-1], ErrorEvent) and isinstance(events[-1].error, EngineFailure)
    text, _ = await answer(scheduler, ask("still there?"))
    assert text == "?ereht llits"
    assert len(engines) == 2 and engines[0].closed  # reloaded once
    await scheduler.close()


async def test_keep_alive_zero_unloads_when_idle_and_negative_never():
    scheduler, engines = make_scheduler()
    await scheduler.start()
    await answer(scheduler, ask("stay", keep_alive=-1))
    await asyncio.sleep(0.8)
    assert [m.name for m in scheduler.loaded_models()] == ["alpha"]
    await answer(scheduler, ask("go", keep_alive=0))
    # the model leaves the list first; its engine thread closes the engine a moment later
    for _ in range(100):
        if not scheduler.loaded_models() and engines[0].closed:
            break
        await asyncio.sleep(0.1)
    assert scheduler.loaded_models() == []
    assert engines[0].closed
    await scheduler.close()


async def test_one_model_at_a_time_by_default():
    scheduler, engines = make_scheduler()
    await answer(scheduler, ask("first", model="alpha"))
    await answer(scheduler, ask("second", model="beta"))
    assert [m.name for m in scheduler.loaded_models()] == ["beta"]
    assert engines[0].closed
    await scheduler.close()


async def test_snapshot_shows_live_rows_and_totals():
    scheduler, _ = make_scheduler()
    stream = await scheduler.submit(ask("w" * 300))
    async for event in stream.events():
        if isinstance(event, Delta):
            break
    snap = scheduler.snapshot()
    assert snap.models[0].name == "alpha"
    live = [r for r in snap.requests if r.finish is None]
    assert live and live[0].state in ("prefill", "decoding")
    stream.cancel()
    async for _ in stream.events():
        pass
    snap = scheduler.snapshot()
    assert snap.outcomes.get("cancelled") == 1
    await scheduler.close()


async def test_count_tokens_renders_with_the_template():
    scheduler, _ = make_scheduler()
    count = await scheduler.count_tokens(ask("hello"))
    assert count == len("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")
    await scheduler.close()


async def test_the_generation_deadline_ends_a_reply_with_a_reason():
    scheduler, _ = make_scheduler(generation_timeout=0.3, engine_options={"step_delay": 0.01})
    await scheduler.start()
    text, done = await answer(scheduler, ask("d" * 3000))
    assert done.reason == "deadline" and "deadline" in done.detail
    assert 0 < len(text) < 3000
    await scheduler.close()


async def test_an_outside_fault_ends_running_replies_even_while_their_engine_thread_is_stuck():
    # a distributed rank lost while rank 0's engine thread waits in a collective that never returns
    # (seen in CI: /health said "rank lost" and four streams hung until the test gave up)
    scheduler, engines = make_scheduler(engine_options={"step_delay": 0.01})
    await scheduler.start()
    stream = await scheduler.submit(ask("s" * 3000))
    events = stream.events()
    assert isinstance(await events.__anext__(), Delta)
    stuck = threading.Event()
    step = engines[0].step
    engines[0].step = lambda: (stuck.wait(), step())[1]
    reason: list[str | None] = [None]
    scheduler.fault = lambda: reason[0]
    reason[0] = "rank 1 lost (disconnected)"

    async def rest_of(events) -> list:
        return [event async for event in events]

    rest = await asyncio.wait_for(rest_of(events), 10)  # ended within a poll, not hung
    assert isinstance(rest[-1], ErrorEvent) and isinstance(rest[-1].error, EngineFailure)
    assert "rank 1 lost" in str(rest[-1].error)
    with pytest.raises(EngineFailure, match="rank 1 lost"):  # refused, not queued behind the stuck thread
        await scheduler.submit(ask("after"))
    stuck.set()
    await scheduler.close()


async def test_a_request_waiting_too_long_for_a_row_is_refused_busy():
    scheduler, _ = make_scheduler(queue_timeout=0.2, engine_options={"rows": 1, "step_delay": 0.01})
    hog = await scheduler.submit(ask("h" * 3000))
    late = await scheduler.submit(ask("late"))
    events = [e async for e in late.events()]
    assert isinstance(events[-1], ErrorEvent) and isinstance(events[-1].error, Busy)
    hog.cancel()
    await scheduler.close()


async def test_a_row_the_engine_ends_with_a_reason_fails_its_request_with_that_reason():
    # a constrained row whose grammar cannot go on: the client gets an error, not a quiet "stop"
    stream = RequestStream(ask("hi"), "job", "alpha", on_cancel=lambda _: None)
    stream.on_update(JobUpdate("job", finish="error", error="the grammar allows no next token"))
    events = [e async for e in stream.events()]
    assert isinstance(events[-1], ErrorEvent) and isinstance(events[-1].error, EngineFailure)
    assert "grammar allows no next token" in str(events[-1].error)
    assert stream.finish == "error"


async def test_text_that_queued_while_the_client_was_behind_goes_out_as_one_delta():
    # hundreds of streams on one event loop: a client's task that is late sends what queued at once
    scheduler, _ = make_scheduler()
    stream = await scheduler.submit(ask("hello there"))
    for _ in range(500):
        if stream.finish is not None:
            break
        await asyncio.sleep(0.01)
    events = [e async for e in stream.events()]
    assert [type(e) for e in events] == [Delta, Done]
    assert events[0].text == "ereht olleh"
    await scheduler.close()
