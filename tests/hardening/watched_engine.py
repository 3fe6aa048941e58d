"""A real engine, watched: the hardening tests wrap the llama.cpp engine to count steps, see when a
cancel arrives and when its row is reported free, and to throw a fault into `step()` on demand.

    engines = WatchedEngines()
    with running_server(settings, engine_factory=engines.factory) as server:
        ...
        engines.fault.arm(MemoryError("simulated"))   # the next step raises it, once
        engines.latest.cancel_steps                   # job id -> steps done when its cancel arrived

Nothing here changes what the engine computes: every call goes to the real engine.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from kinfer.config import Settings
from kinfer.engines.base import Engine, EngineStats, GenerationJob, JobUpdate
from kinfer.engines.loader import load_engine


class FaultSwitch:
    """A one-shot fault: armed from the test's thread, fired by the engine thread's next step."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: BaseException | None = None
        self.fired = threading.Event()

    def arm(self, error: BaseException) -> None:
        with self._lock:
            self._pending = error
            self.fired.clear()

    def take(self) -> BaseException | None:
        with self._lock:
            error, self._pending = self._pending, None
        if error is not None:
            self.fired.set()
        return error


@dataclass
class WatchedEngine:
    """Delegates to `inner`; records steps, cancels and finishes per job."""

    inner: Engine
    fault: FaultSwitch
    steps: int = 0
    submitted: list[str] = field(default_factory=list)
    cancel_steps: dict[str, int] = field(default_factory=dict)  # steps done when cancel() arrived
    finish_steps: dict[str, tuple[int, str]] = field(default_factory=dict)  # step that freed it, why

    @property
    def info(self):
        return self.inner.info

    def tokenize(self, text: str) -> list[int]:
        return self.inner.tokenize(text)

    def detokenize(self, tokens: list[int]) -> str:
        return self.inner.detokenize(tokens)

    @property
    def free_rows(self) -> int:
        return self.inner.free_rows

    @property
    def has_work(self) -> bool:
        return self.inner.has_work

    def submit(self, job: GenerationJob) -> int:
        reused = self.inner.submit(job)
        self.submitted.append(job.job_id)
        return reused

    def cancel(self, job_id: str) -> None:
        self.cancel_steps.setdefault(job_id, self.steps)
        self.inner.cancel(job_id)

    def step(self) -> list[JobUpdate]:
        error = self.fault.take()
        if error is not None:
            raise error
        updates = self.inner.step()
        self.steps += 1
        for update in updates:
            if update.finish is not None:
                self.finish_steps[update.job_id] = (self.steps, update.finish)
        return updates

    def stats(self) -> EngineStats:
        return self.inner.stats()

    def close(self) -> None:
        self.inner.close()


class WatchedEngines:
    """An engine factory for `running_server`: each (re)load builds a real engine and watches it."""

    def __init__(self) -> None:
        self.fault = FaultSwitch()
        self.loaded: list[WatchedEngine] = []

    def factory(self, model, settings: Settings, ctx: int | None) -> WatchedEngine:
        engine = WatchedEngine(load_engine(model, settings, ctx=ctx), self.fault)
        self.loaded.append(engine)
        return engine

    @property
    def latest(self) -> WatchedEngine:
        return self.loaded[-1]
