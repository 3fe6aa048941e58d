"""Continuous batching on llama.cpp: rows decoded together give the same greedy tokens as alone,
and a row freed by cancel or finish is taken by the next job at once."""

from __future__ import annotations

import pytest

from kinfer.errors import Busy
from tests.engines.llama.fixtures import chat_prompt, job, make_engine, run_alone, run_jobs

__all__ = ["make_engine"]

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about rain.",
    "Count from 1 to 10.",
    "Name three colors.",
    "What is 2+2?",
    "Tell me a joke about cats.",
    "Explain gravity briefly.",
    "Translate 'hello' to Spanish.",
]


def test_each_row_of_a_batch_of_eight_matches_its_solo_run(make_engine):
    engine = make_engine(rows=8, prefix_cache=False)
    jobs = [job(f"q{i}", chat_prompt(engine, q), max_tokens=20) for i, q in enumerate(QUESTIONS)]
    batched_steps: list[int] = []

    batched = run_jobs(engine, jobs, on_step=lambda n, _: batched_steps.append(engine.stats().rows_busy))

    assert max(batched_steps) == 8, "all eight rows should have been decoded together"
    for one in jobs:
        alone = run_alone(engine, one)
        assert batched[one.job_id].text == alone.text, one.job_id
        assert batched[one.job_id].new_tokens == alone.new_tokens
        assert batched[one.job_id].finish == alone.finish
    assert engine.stats().rows_busy == 0
    assert engine.free_rows == 8


def test_a_cancelled_row_frees_its_slot_and_the_others_finish_unchanged(make_engine):
    engine = make_engine(rows=3, prefix_cache=False)
    a, b, c, d = (
        job(k, chat_prompt(engine, q), max_tokens=24) for k, q in zip("abcd", QUESTIONS[1:5], strict=True)
    )
    expected = {one.job_id: run_alone(engine, one).text for one in (a, c, d)}

    for one in (a, b, c):
        engine.submit(one)
    early = {}
    for _ in range(3):
        for update in engine.step():
            early.setdefault(update.job_id, []).append(update)
    assert engine.free_rows == 0

    engine.cancel("b")
    assert engine.free_rows == 1, "cancel frees the row at once"
    engine.submit(d)  # the next waiting job takes the freed row
    assert engine.free_rows == 0
    rest = run_jobs(engine, [])

    assert [u.finish for u in rest["b"].updates] == ["cancelled"], "exactly one final update"
    for key in "acd":
        text = "".join(u.text for u in early.get(key, [])) + rest[key].text
        assert text == expected[key], key
        assert rest[key].finish in ("stop", "length")


def test_a_prompt_prefilled_in_chunks_beside_generating_rows_matches_its_solo_run(make_engine):
    engine = make_engine(rows=3, prefix_cache=False, step_tokens=16)
    short = [job(f"s{i}", chat_prompt(engine, q), max_tokens=24) for i, q in enumerate(QUESTIONS[:2])]
    filler = "the fox jumps over the dog. " * 12
    long = job("long", chat_prompt(engine, "Summarise: " + filler), max_tokens=12)
    assert len(long.prompt) > 4 * 16, "the long prompt takes several steps"
    alone = {one.job_id: run_alone(engine, one) for one in [*short, long]}
    mixed_steps = 0

    def watch(_step, results):
        nonlocal mixed_steps
        prefilling = 0 < results["long"].prompt_processed < len(long.prompt)
        generating = sum(results[s.job_id].new_tokens for s in short)
        if prefilling and generating and results["s0"].finish is None:
            mixed_steps += 1

    together = run_jobs(engine, [*short, long], on_step=watch)

    assert mixed_steps >= 2, "the long prompt was prefilled in chunks while the short rows generated"
    for key, result in together.items():
        assert result.text == alone[key].text, key


def test_cancel_while_prefilling_frees_the_row(make_engine):
    engine = make_engine(rows=2, prefix_cache=False, step_tokens=32)
    prompt = chat_prompt(engine, "Summarise this. " + "The quick brown fox jumps over the lazy dog. " * 10)
    assert len(prompt) > 2 * 32, "the prompt must need several steps to prefill"
    engine.submit(job("long", prompt))

    first = engine.step()
    assert [(u.job_id, u.prompt_processed, u.finish) for u in first] == [("long", 32, None)]
    engine.cancel("long")
    assert engine.free_rows == 2
    assert engine.has_work, "the cancellation is still to be reported"
    (update,) = engine.step()
    assert (update.job_id, update.finish, update.new_tokens) == ("long", "cancelled", 0)
    assert not engine.has_work
    assert engine.step() == []


def test_cancel_of_an_unknown_or_finished_job_is_ignored(make_engine):
    engine = make_engine(rows=1, prefix_cache=False)
    done = run_alone(engine, job("x", chat_prompt(engine, "Hi"), max_tokens=2))
    assert done.finish == "length"
    engine.cancel("x")
    engine.cancel("never-submitted")
    assert not engine.has_work
    assert engine.free_rows == 1


def test_submit_without_a_free_row_is_refused(make_engine):
    engine = make_engine(rows=1, prefix_cache=False)
    engine.submit(job("first", chat_prompt(engine, "Hi")))
    with pytest.raises(Busy):
        engine.submit(job("second", chat_prompt(engine, "Hello")))
