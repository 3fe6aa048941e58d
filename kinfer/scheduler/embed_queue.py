"""Embedding work on the engine thread: embed the (already tokenized) inputs of every waiting request
together, one bounded pass per turn of the engine loop (between chat steps), so an
embedding never waits for a chat reply to finish and a large request never stalls the chat rows.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from kinfer.engines.base import Embedder, Engine
from kinfer.errors import EngineFailure, KinferError
from kinfer.scheduler.jobs import EmbedWork

log = logging.getLogger(__name__)


@dataclass(eq=False)  # compared by identity: it holds arrays
class _EmbedJob:
    work: EmbedWork
    inputs: list[tuple[int, ...]]
    vectors: list[np.ndarray | None] = field(default_factory=list)
    next: int = 0  # the first input not yet given to a pass
    done: int = 0
    tokens_done: int = 0


class EmbedQueue:
    """FIFO over requests; a pass takes inputs from the front request, then the next ones, up to the
    engine's token budget."""

    def __init__(self, call_soon: Callable[..., None]) -> None:
        self._jobs: deque[_EmbedJob] = deque()
        self._call_soon = call_soon  # the worker's loop.call_soon_threadsafe wrapper

    def __bool__(self) -> bool:
        return bool(self._jobs)

    def __len__(self) -> int:
        return len(self._jobs)

    def add(self, work: EmbedWork) -> None:
        """Queue a request whose inputs were tokenized in its own task (`embed_prepare`)."""
        self._jobs.append(_EmbedJob(work, list(work.inputs), [None] * len(work.inputs)))

    def run_pass(self, engine: Engine) -> None:
        """Embed the next inputs (up to the engine's token budget) in shared forward passes."""
        spec = engine.info.embedding
        budget = spec.batch_tokens if spec else 0
        taken: list[tuple[_EmbedJob, int]] = []
        tokens = 0
        for job in self._jobs:
            while job.next < len(job.inputs):
                size = len(job.inputs[job.next])
                if taken and tokens + size > budget:
                    break
                taken.append((job, job.next))
                tokens += size
                job.next += 1
            if job.next < len(job.inputs):
                break
        if not taken:
            return
        try:
            vectors = cast(Embedder, engine).embed([job.inputs[i] for job, i in taken])
        except Exception as exc:
            log.exception("embedding pass failed on %s", engine.info.name)
            error = exc if isinstance(exc, KinferError) else EngineFailure(f"embedding failed: {exc}")
            for job in {id(job): job for job, _ in taken}.values():
                self._fail(job, error)
            return
        touched: dict[int, _EmbedJob] = {}
        for (job, i), vector in zip(taken, vectors, strict=True):
            job.vectors[i] = vector
            job.done += 1
            job.tokens_done += len(job.inputs[i])
            touched[id(job)] = job
        for job in touched.values():
            if job.done == len(job.inputs):
                self._jobs.remove(job)
                _settle(
                    job.work.reply, ([v for v in job.vectors if v is not None], [len(i) for i in job.inputs])
                )
            else:
                self._call_soon(job.work.progress, job.done, job.tokens_done)

    def cancel(self, job_id: str) -> bool:
        for job in self._jobs:
            if job.work.job_id == job_id:
                self._jobs.remove(job)
                job.work.reply.cancel()
                return True
        return False

    def fail_all(self, error: Exception) -> None:
        while self._jobs:
            self._fail(self._jobs[0], error)

    def _fail(self, job: _EmbedJob, error: Exception) -> None:
        if job in self._jobs:
            self._jobs.remove(job)
        _settle(job.work.reply, error=error)


def _settle(reply: Future, result: object = None, *, error: Exception | None = None) -> None:
    """Answer the request, unless it is already answered or was cancelled (the client left while
    its inputs were in a pass)."""
    try:
        if error is not None:
            reply.set_exception(error)
        else:
            reply.set_result(result)
    except InvalidStateError:
        pass
