"""The pieces rank 0 and the followers share to run the same step: the planned prompt room, and
replaying rank 0's calls on a follower's engine."""

from __future__ import annotations

from kinfer.distributed.plan import Cancel, Plan, Submit
from kinfer.engines.prefill_budget import PrefillBudget


class PlannedBudget:
    """Stands in for an engine's `PrefillBudget`: answers `room` with what rank 0 planned for this step
    (its budget learns from rank 0's clock; a follower's clock is never asked)."""

    def __init__(self, learner: PrefillBudget | None) -> None:
        self.learner = learner
        self.planned = (0, 0)  # (room beside decoding rows, room when none decodes)

    def plan(self, cap: int) -> tuple[int, int]:
        """Rank 0: this step's answers, decided before the step (room() reads no state the step
        changes: the learner only moves when a step ends)."""
        assert self.learner is not None
        self.planned = (self.learner.room(cap, True), self.learner.room(cap, False))
        return self.planned

    def room(self, cap: int, decoding: bool, taken: int = 0, spent_s: float | None = None) -> int:
        return max(0, min(cap, self.planned[0] if decoding else self.planned[1]))

    def took(self, tokens: int) -> None:
        if self.learner is not None:
            self.learner.took(tokens)

    def prefilled(self, tokens: int, seconds: float) -> None:
        if self.learner is not None:
            self.learner.prefilled(tokens, seconds)

    def decoded(self, seconds: float) -> None:
        if self.learner is not None:
            self.learner.decoded(seconds)

    @property
    def decode_s(self) -> float | None:
        return self.learner.decode_s if self.learner is not None else None


def replay(engine, plan: Plan) -> list:
    """A follower: rank 0's calls since the last step, in order, then the step itself (its updates:
    rank 0's, which a follower has nobody to send to)."""
    for call in plan.calls:
        if isinstance(call, Submit):
            engine.submit(call.job)
        elif isinstance(call, Cancel):
            engine.cancel(call.job_id)
    engine.prefill_budget.planned = (plan.room_decoding, plan.room_alone)
    return engine.step()


def build_engine(path, name: str, kwargs: dict, group, *, size=None):
    """This rank's shard of the model as an `MlxEngine` whose prompt room comes from the plan. Built
    without the load-time self-check: its passes hold collectives, so every rank runs it (`check`) once
    all have built their engine."""
    from kinfer.engines.mlx.engine import MlxEngine

    kwargs = {**kwargs, "self_check": False}
    engine = MlxEngine(path, name=name, group=group, size=size, **kwargs)
    learner = engine.prefill_budget if group.rank() == 0 else None
    engine.prefill_budget = PlannedBudget(learner)
    return engine


def check(engine) -> None:
    from kinfer.engines.mlx.check import self_check_engine

    self_check_engine(engine)
