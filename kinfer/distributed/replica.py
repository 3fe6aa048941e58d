"""The pieces rank 0 and the followers share to run the same step: one prefill budget state, and
replaying rank 0's calls on a follower's engine."""

from __future__ import annotations

from kinfer.distributed.plan import Budget, Cancel, Plan, Submit
from kinfer.engines.prefill_budget import PrefillBudget


class PlannedBudget:
    """Stands in for an engine's `PrefillBudget` on every rank. Rank 0's learns from its clock as usual
    (`learner`) and its state travels with each plan; a follower's takes that state before its step
    (`follow`) and learns nothing itself, so `room` (which also weighs the step's own rows, the burst
    factor) answers the same on every rank."""

    def __init__(self, learner: PrefillBudget) -> None:
        self.learner = learner
        self.leads = True

    def state(self) -> Budget:
        b = self.learner
        return (b.last_chunk, b.per_token_s, b.decode_s)

    def follow(self, state: Budget) -> None:
        self.leads = False
        b = self.learner
        b.last_chunk, b.per_token_s, b.decode_s = state

    def room(self, cap: int, decoding: bool, taken: int = 0, spent_s=None, burst: float = 1.0) -> int:
        return self.learner.room(cap, decoding, taken, spent_s, burst)

    def took(self, tokens: int, room: int | None = None) -> None:
        if self.leads:
            self.learner.took(tokens, room)

    def prefilled(self, tokens: int, seconds: float) -> None:
        if self.leads:
            self.learner.prefilled(tokens, seconds)

    def decoded(self, seconds: float) -> None:
        if self.leads:
            self.learner.decoded(seconds)

    def __getattr__(self, name: str):  # target_s, decode_s, per_token_s, ...: the learner's
        return getattr(self.learner, name)


def replay(engine, plan: Plan) -> list:
    """A follower: rank 0's calls since the last step, in order, then the step itself (its updates:
    rank 0's, which a follower has nobody to send to)."""
    for call in plan.calls:
        if isinstance(call, Submit):
            engine.submit(call.job)
        elif isinstance(call, Cancel):
            engine.cancel(call.job_id)
    engine.prefill_budget.follow(plan.budget)
    return engine.step()


def build_engine(path, name: str, kwargs: dict, group, *, size=None):
    """This rank's shard of the model as an `MlxEngine` whose prompt room comes from the plan. Built
    without the load-time self-check: its passes hold collectives, so every rank runs it (`check`) once
    all have built their engine."""
    from kinfer.engines.mlx.engine import MlxEngine

    kwargs = {**kwargs, "self_check": False}
    engine = MlxEngine(path, name=name, group=group, size=size, **kwargs)
    engine.prefill_budget = PlannedBudget(engine.prefill_budget)
    return engine


def check(engine) -> None:
    from kinfer.engines.mlx.check import self_check_engine

    self_check_engine(engine)
