"""The llama.cpp engine's decode thread count follows the load (thread_tuner.py) without changing a token.

ggml's CPU matmuls split output rows among the threads, each row computed whole by one of them, so a
step's numbers do not depend on how many threads ran it: the tuner may change the count between any
two steps of a reply. A user's `threads` fixes the count (the override); prompt chunks always run on
every thread.
"""

from __future__ import annotations

import pytest

from kinfer.engines.llama import native
from kinfer.engines.llama.sizing import available_threads
from kinfer.engines.llama.thread_tuner import TunerConfig
from tests.engines.llama.fixtures import *  # noqa: F403

# probe at every chance, one step at a time, and switch on any win: the count changes all the time
RESTLESS = TunerConfig((2, 1), probe_every_s=0.0, probe_steps=1, margin=0.0, confirmations=1)
QUESTIONS = ("Name three fruits.", "What is the capital of France?", "Count to five.", "Say hello.")


@pytest.fixture
def thread_counts(monkeypatch) -> list[int]:
    """Every count the engines set on their contexts, in order (llama.cpp still does the work)."""
    counts: list[int] = []
    real = native.set_threads

    def spy(ctx: int, threads: int) -> None:
        counts.append(threads)
        real(ctx, threads)

    monkeypatch.setattr(native, "set_threads", spy)
    return counts


def replies(engine, max_tokens: int = 24) -> dict[str, str]:
    jobs = [job(f"q{i}", chat_prompt(engine, q), max_tokens) for i, q in enumerate(QUESTIONS)]  # noqa: F405
    return {key: result.text for key, result in run_jobs(engine, jobs).items()}  # noqa: F405


def test_greedy_tokens_do_not_depend_on_the_thread_count_chosen_mid_reply(make_engine, thread_counts):
    one = replies(make_engine(threads=1))
    two = replies(make_engine(threads=2))
    assert thread_counts == []  # fixed counts: nothing is ever switched
    tuned_engine = make_engine(threads=2, thread_tuning=RESTLESS)
    tuned = replies(tuned_engine)
    tuner = tuned_engine._threads.tuner
    assert tuner is not None and tuner.probes >= 3
    assert thread_counts.count(1) >= 3 and thread_counts.count(2) >= 3  # back and forth, mid-reply
    assert one == two == tuned
    assert all(text for text in one.values())


def test_automatic_threads_are_tuned_on_a_cpu_and_a_fixed_count_is_kept(make_engine, thread_counts):
    fixed = make_engine(threads=1)
    replies(fixed, max_tokens=8)
    assert fixed._threads.tuner is None and fixed.stats().threads == 1 and thread_counts == []
    automatic = make_engine(threads=0)
    cores = available_threads()
    assert automatic.plan.threads == cores
    assert (automatic._threads.tuner is not None) == (cores > 1 and not native.supports_gpu_offload())
    assert automatic.stats().threads == cores  # every thread until a probe says otherwise


def test_prompt_chunks_run_on_every_thread_while_decode_steps_probe(make_engine, thread_counts):
    engine = make_engine(threads=2, thread_tuning=RESTLESS, step_tokens=64)
    first = job("first", chat_prompt(engine, QUESTIONS[0]), 48)  # noqa: F405
    long = job("long", chat_prompt(engine, "Tell me about bread. " * 40), 4)  # noqa: F405
    in_force: list[int] = []  # the count in force after each step that carried a chunk of `long`
    done = [0]

    def watch(steps: int, results) -> None:
        processed = results["long"].prompt_processed
        if processed > done[0]:
            in_force.append(thread_counts[-1] if thread_counts else 2)
        done[0] = processed

    run_jobs(engine, [first, long], on_step=watch)  # noqa: F405
    # a step that carried a prompt chunk ran it on every thread, whatever its decode part ran on
    assert len(in_force) >= 3 and set(in_force) == {2}
    assert 1 in thread_counts
