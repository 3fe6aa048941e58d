"""Drive any engine the way the scheduler does: submit in order while a row is free, step while there is
work, and collect what each job was told. Shared by the llama.cpp and MLX engine tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kinfer.engines.base import Engine, GenerationJob, JobUpdate
from kinfer.protocol import Sampling

GREEDY = Sampling(temperature=0.0)


@dataclass
class JobResult:
    """Everything the engine reported for one job."""

    text: str = ""
    new_tokens: int = 0
    finish: str | None = None
    stop_string: str | None = None  # which stop string ended the reply, as the engine reported it
    prompt_processed: int = 0
    reused_tokens: int = 0
    updates: list[JobUpdate] = field(default_factory=list)


def job(job_id: str, prompt: Sequence[int], max_tokens: int = 16, **kw) -> GenerationJob:
    kw.setdefault("sampling", GREEDY)
    return GenerationJob(job_id=job_id, prompt=tuple(prompt), max_tokens=max_tokens, **kw)


def run_jobs(
    engine: Engine,
    jobs: Sequence[GenerationJob],
    *,
    on_step: Callable[[int, dict[str, JobResult]], None] | None = None,
    max_steps: int = 10_000,
) -> dict[str, JobResult]:
    """Run the jobs to completion. Checks the protocol on the way: one final update per job, nothing
    after it, a stop string named only by a final "stop". Updates report totals; one without them (a
    cancel's) keeps the totals already seen. A job's choice i > 0 is reported as "<job_id>#<i>"."""
    queue = list(jobs)
    results: dict[str, JobResult] = {j.job_id: JobResult() for j in jobs}
    steps = 0
    while queue or engine.has_work:
        while queue and engine.free_rows >= queue[0].choices:
            engine.submit(queue.pop(0))
        for update in engine.step():
            key = choice_key(update.job_id, update.choice)
            result = results.setdefault(key, JobResult())
            assert result.finish is None, f"{key} got an update after finishing"
            assert update.stop_string is None or update.finish == "stop", update
            result.updates.append(update)
            result.text += update.text
            result.new_tokens += update.new_tokens
            result.prompt_processed = max(result.prompt_processed, update.prompt_processed)
            result.reused_tokens = update.reused_tokens or result.reused_tokens
            result.finish = update.finish
            result.stop_string = update.stop_string
        steps += 1
        if on_step is not None:
            on_step(steps, results)
        assert steps < max_steps, "the engine did not finish"
    expected = {choice_key(j.job_id, c) for j in jobs for c in range(j.choices)}
    assert expected <= results.keys(), f"choices never reported: {expected - results.keys()}"
    unfinished = [k for k, r in results.items() if r.finish is None]
    assert not unfinished, f"jobs never finished: {unfinished}"
    return results


def choice_key(job_id: str, choice: int) -> str:
    return job_id if choice == 0 else f"{job_id}#{choice}"


def run_alone(engine: Engine, one: GenerationJob) -> JobResult:
    return run_jobs(engine, [one])[one.job_id]
