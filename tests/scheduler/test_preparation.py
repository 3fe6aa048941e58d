"""Prompts are rendered and tokenized in their request's own task, off the engine thread: a slow or
failing preparation holds up nobody else, and a failure is that request's 400 (scripted engine)."""

from __future__ import annotations

import asyncio

import pytest

from kinfer.errors import EngineFailure, InvalidRequest
from kinfer.protocol import Delta
from kinfer.scheduler.stream import RequestStream
from tests.scheduler.test_scheduler import ask, make_scheduler
from tests.scripted_engine import CHATML

pytestmark = pytest.mark.asyncio

# ChatML that refuses a conversation mentioning "boom", as real templates refuse what they cannot render
REFUSING = (
    "{% for m in messages %}{% if 'boom' in m.content %}{{ raise_exception('no booms here') }}"
    "{% endif %}{% endfor %}" + CHATML
)


class Counter:
    """Counts a stream's text deltas as they arrive."""

    def __init__(self, stream: RequestStream) -> None:
        self.deltas = 0
        self.text = ""
        self.task = asyncio.create_task(self._read(stream))

    async def _read(self, stream: RequestStream) -> None:
        async for event in stream.events():
            if isinstance(event, Delta):
                self.deltas += 1
                self.text += event.text


async def streaming(scheduler, texts: list[str]) -> list[Counter]:
    """Rows that are decoding: each has sent a token already."""
    counters = [Counter(await scheduler.submit(ask(text))) for text in texts]
    while any(c.deltas == 0 for c in counters):
        await asyncio.sleep(0.005)
    return counters


async def test_prompts_are_tokenized_off_the_engine_thread():
    scheduler, engines = make_scheduler()
    await asyncio.gather(*(scheduler.submit(ask(f"question {i}")) for i in range(4)))
    await scheduler.count_tokens(ask("how many?"))
    threads = engines[0].tokenize_threads
    assert threads and not any(name.startswith("engine:") for name in threads), threads
    await scheduler.close()


async def test_a_prompt_slow_to_prepare_does_not_stop_the_rows_streaming():
    scheduler, _ = make_scheduler(engine_options={"slow_tokenize": ("SLOW", 1.0), "step_delay": 0.01})
    rows = await streaming(scheduler, ["a" * 3000, "b" * 3000])
    before = [row.deltas for row in rows]
    await scheduler.submit(ask("SLOW to tokenize"))  # returns once its prompt is prepared (1 s)
    during = [row.deltas - seen for row, seen in zip(rows, before, strict=True)]
    # ~100 steps of 10 ms fit in that second; on the engine thread the rows would have got none
    assert min(during) >= 10, during
    for row in rows:
        row.task.cancel()
    await scheduler.close()


async def test_a_template_that_raises_ends_that_request_with_a_400_and_the_batch_keeps_running():
    scheduler, _ = make_scheduler(engine_options={"template": REFUSING})
    rows = await streaming(scheduler, ["first row " * 20, "second row " * 20])
    with pytest.raises(InvalidRequest) as refused:
        await scheduler.submit(ask("this goes boom"))
    assert refused.value.status == 400 and "no booms here" in str(refused.value)
    await asyncio.gather(*(row.task for row in rows))
    assert [row.text for row in rows] == [("first row " * 20)[::-1], ("second row " * 20)[::-1]]
    assert scheduler.outcomes["error"] == 1 and scheduler.outcomes["stop"] == 2
    await scheduler.close()


async def test_a_tokenizer_failure_ends_that_request_with_a_400_and_the_batch_keeps_running():
    scheduler, _ = make_scheduler(engine_options={"tokenize_fails_on": "\ufffe"})
    rows = await streaming(scheduler, ["first row " * 20, "second row " * 20])
    with pytest.raises(InvalidRequest) as refused:
        await scheduler.submit(ask("cannot take \ufffe"))
    assert refused.value.status == 400 and "could not prepare the prompt" in str(refused.value)
    with pytest.raises(InvalidRequest):  # counting its tokens fails the same way
        await scheduler.count_tokens(ask("cannot take \ufffe"))
    await asyncio.gather(*(row.task for row in rows))
    assert [row.text for row in rows] == [("first row " * 20)[::-1], ("second row " * 20)[::-1]]
    text = (await (await scheduler.submit(ask("after"))).collect())[0]
    assert text == "retfa"
    await scheduler.close()


async def test_a_prompt_prepared_while_its_model_unloads_ends_with_an_error_not_a_hang():
    scheduler, engines = make_scheduler(engine_options={"slow_tokenize": ("SLOW", 0.5)})
    await scheduler.count_tokens(ask("load the model"))
    pending = asyncio.create_task(scheduler.submit(ask("SLOW to tokenize")))
    await asyncio.sleep(0.1)  # its tokenizer is busy with it
    await scheduler.unload("alpha")
    assert engines[0].closed  # closed once the preparation let go of its tokenizer, not under it
    stream = await asyncio.wait_for(pending, 10)
    with pytest.raises(EngineFailure, match="unloaded"):
        await asyncio.wait_for(stream.collect(), 10)
    await scheduler.close()


async def test_ollamas_context_is_tokenized_off_the_engine_thread_and_arrives_with_the_reply():
    """Ollama's `context` (prompt and reply as token ids) is tokenized when the reply ends: on the engine
    thread, a long conversation's ids would stall every row; they still arrive before the reply ends."""
    # the scripted reply reverses the prompt: only the context (prompt + reply) holds "SLOW"
    scheduler, engines = make_scheduler(engine_options={"slow_tokenize": ("SLOW", 2.0), "step_delay": 0.01})
    rows = await streaming(scheduler, ["a" * 3000, "b" * 3000])
    stream = await scheduler.submit(ask("WOLS", return_context=True))
    before = [row.deltas for row in rows]
    text, _thinking, _calls, _done = await stream.collect()
    during = [row.deltas - seen for row, seen in zip(rows, before, strict=True)]
    assert text == "SLOW" and "".join(map(chr, stream.context or ())).endswith(
        "WOLS<|im_end|>\n<|im_start|>assistant\nSLOW"
    )
    assert not any(name.startswith("engine:") for name in engines[0].tokenize_threads)
    # ~200 steps of 10 ms fit in those 2 s; tokenized on the engine thread, the rows would get ~5
    assert min(during) >= 40, during
    for row in rows:
        row.task.cancel()
    await scheduler.close()
