"""Helpers for the llama.cpp engine tests: build engines on the bundled SmolLM2 GGUF and drive them
the way the scheduler does (submit while a row is free, step until done), collecting each job's
reply. Import the fixtures into a test module with `from tests.engines.llama_fixtures import *`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kinfer.engines.base import GenerationJob, JobUpdate
from kinfer.engines.llama import LlamaEngine
from kinfer.protocol import Sampling

GREEDY = Sampling(temperature=0.0)

# a system prompt long enough for the prefix pool to bother with (it skips short prefixes)
SYSTEM = (
    "You are a careful assistant for a small bakery in Lyon. You answer questions about bread, "
    "pastries, opening hours and prices. Keep answers short and friendly, and never invent prices "
    "that are not listed. The bakery opens at seven in the morning and closes at seven at night."
)


@dataclass
class JobResult:
    """Everything the engine reported for one job."""

    text: str = ""
    new_tokens: int = 0
    finish: str | None = None
    prompt_processed: int = 0
    reused_tokens: int = 0
    updates: list[JobUpdate] = field(default_factory=list)


def chat_prompt(engine: LlamaEngine, user: str, *, system: str | None = None, history: str = "") -> tuple:
    """SmolLM2's ChatML prompt for one user turn (after `history`, already rendered)."""
    text = f"<|im_start|>system\n{system}<|im_end|>\n" if system and not history else ""
    text += history + f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    return tuple(engine.tokenize(text))


def job(job_id: str, prompt: Sequence[int], max_tokens: int = 16, **kw) -> GenerationJob:
    kw.setdefault("sampling", GREEDY)
    return GenerationJob(job_id=job_id, prompt=tuple(prompt), max_tokens=max_tokens, **kw)


def run_jobs(
    engine: LlamaEngine,
    jobs: Sequence[GenerationJob],
    *,
    on_step: Callable[[int, dict[str, JobResult]], None] | None = None,
    max_steps: int = 10_000,
) -> dict[str, JobResult]:
    """Run the jobs to completion as the scheduler would: submit in order while a row is free, step
    while there is work. Checks the protocol on the way: one final update per job, nothing after it."""
    queue = list(jobs)
    results: dict[str, JobResult] = {j.job_id: JobResult() for j in jobs}
    steps = 0
    while queue or engine.has_work:
        while queue and engine.free_rows > 0:
            engine.submit(queue.pop(0))
        for update in engine.step():
            result = results.setdefault(update.job_id, JobResult())
            assert result.finish is None, f"{update.job_id} got an update after finishing"
            result.updates.append(update)
            result.text += update.text
            result.new_tokens += update.new_tokens
            result.prompt_processed = update.prompt_processed
            result.reused_tokens = update.reused_tokens
            result.finish = update.finish
        steps += 1
        if on_step is not None:
            on_step(steps, results)
        assert steps < max_steps, "the engine did not finish"
    unfinished = [k for k, r in results.items() if r.finish is None]
    assert not unfinished, f"jobs never finished: {unfinished}"
    return results


def run_alone(engine: LlamaEngine, one: GenerationJob) -> JobResult:
    return run_jobs(engine, [one])[one.job_id]


@pytest.fixture
def make_engine(smollm2_gguf: Path) -> Iterator[Callable[..., LlamaEngine]]:
    """Builds LlamaEngines on the bundled SmolLM2 (small rows by default) and closes them after."""
    engines: list[LlamaEngine] = []

    def make(**kw) -> LlamaEngine:
        kw.setdefault("rows", 4)
        kw.setdefault("ctx", 1024)
        # one thread: this 2-core machine is shared with other test runs, and ggml's spinning thread
        # barrier slows down several-fold when one of its threads loses its core
        kw.setdefault("threads", 1)
        engine = LlamaEngine(smollm2_gguf, name="smollm2", **kw)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()
