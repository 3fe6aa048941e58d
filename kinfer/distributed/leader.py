"""Rank 0's engine: the MLX engine of its shard, recording the calls the other ranks must replay.

The scheduler drives it like any engine. `submit` and `cancel` run at once on rank 0 (so their errors
are the caller's, in its dialect) and are remembered; `step` broadcasts them with the state of its
prefill budget (plan.py), then runs the step, which the followers run at the same time. A step that
fails (a rank lost: MLX raises "connection to a peer was lost") marks the cluster failed: the
scheduler fails the running replies and its reload attempt is refused with the reason (cluster.py).
"""

from __future__ import annotations

from kinfer.distributed.plan import Cancel, Plan, Submit, broadcast
from kinfer.engines.base import EngineStats, GenerationJob, JobUpdate
from kinfer.errors import EngineFailure, InvalidRequest


class LeaderEngine:
    """The `Engine` protocol over rank 0's `MlxEngine`. `health` (a `ClusterHealth`) is told when a step
    fails, and a rank the heartbeat found lost fails the next step at once, before its collectives."""

    def __init__(self, engine, group, health) -> None:
        self._engine = engine
        self._group = group
        self._health = health
        self._on_fault = health.fail
        self._calls: list[Submit | Cancel] = []
        self._broken = False
        self.info = engine.info

    # ---- what the scheduler reads ----------------------------------------------------------

    @property
    def free_rows(self) -> int:
        return self._engine.free_rows

    @property
    def has_work(self) -> bool:
        return self._engine.has_work or bool(self._calls)

    def stats(self) -> EngineStats:
        return self._engine.stats()

    def tokenize(self, text: str) -> list[int]:
        return self._engine.tokenize(text)

    def detokenize(self, tokens: list[int]) -> str:
        return self._engine.detokenize(tokens)

    def embed_tokenize(self, text: str) -> list[int]:
        raise InvalidRequest(f"{self.info.name} is served across ranks: it has no embedding path")

    def embed(self, inputs):
        raise InvalidRequest(f"{self.info.name} is served across ranks: it has no embedding path")

    # ---- what every rank does -------------------------------------------------------------

    def submit(self, job: GenerationJob) -> int:
        reused = self._engine.submit(job)  # refused here (400, 503): nothing to replay
        self._calls.append(Submit(job))
        return reused

    def cancel(self, job_id: str) -> None:
        self._engine.cancel(job_id)
        self._calls.append(Cancel(job_id))

    def step(self) -> list[JobUpdate]:
        if self._broken or not self._health.ok:
            self._broken = True
            raise EngineFailure(f"the distributed group failed: {self._health.error or 'a rank was lost'}")
        calls, self._calls = tuple(self._calls), []
        try:
            broadcast(Plan("step", self._engine.prefill_budget.state(), calls), self._group)
            return self._engine.step()
        except Exception as exc:
            self._broken = True
            self._on_fault(str(exc))
            raise

    def close(self) -> None:
        if not self._broken:
            try:
                broadcast(Plan("close"), self._group)
            except Exception as exc:
                self._on_fault(str(exc))
        self._engine.close()
