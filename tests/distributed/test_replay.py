"""The replayed-step scheme in one process: a follower engine fed rank 0's plans makes the same
updates step by step (on a group of one, where the collectives are the identity; the two-process
tests run the same code across ranks)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kinfer.distributed import leader as leader_module
from kinfer.distributed.health import ClusterHealth
from kinfer.distributed.leader import LeaderEngine
from kinfer.distributed.replica import build_engine, replay
from kinfer.engines.base import Sampling
from kinfer.errors import Busy, EngineFailure, InvalidRequest
from tests.engines.driver import job, run_jobs
from tests.fixtures.tiny_mlx import build_tiny_model

mx = pytest.importorskip("mlx.core")

ENGINE = {"rows": 3, "ctx": 256, "prefill_chunk": 16}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("replay") / "tiny-qwen3", "qwen3")


def test_a_follower_replaying_the_plans_makes_the_leaders_updates(tiny: Path, monkeypatch):
    group = mx.distributed.init()
    plans = []
    monkeypatch.setattr(leader_module, "broadcast", lambda plan, _group: plans.append(plan) or plan)
    rank0 = build_engine(tiny, "t", ENGINE, group)
    health = ClusterHealth(1)
    leader = LeaderEngine(rank0, group, health)
    follower = build_engine(tiny, "t", {**ENGINE, "memory_budget_gb": -1.0}, group, size=rank0.plan)
    seeded = Sampling(temperature=0.8, seed=3)
    jobs = [
        job("a", range(5, 60), max_tokens=20),  # prefilled in chunks beside decoding rows
        job("b", range(7, 20), max_tokens=12, sampling=seeded),
        job("c", range(3, 30), max_tokens=8, choices=2),  # forks its prompt into a second row
        job("d", range(5, 60), max_tokens=6),  # adopts a's prompt from the pool
        job("e", range(9, 40), max_tokens=30),
    ]
    steps: list[tuple] = []  # (plan, the leader's updates) per step
    step = leader.step

    def recorded():
        updates = step()
        steps.append((plans[-1], updates))
        return updates

    leader.step = recorded
    results = run_jobs(leader, jobs)
    assert all(r.finish in ("length", "stop") for r in results.values()) and health.ok
    assert any(plan.calls for plan, _ in steps) and any(plan.budget[1] for plan, _ in steps)
    for plan, updates in steps:
        assert replay(follower, plan) == updates
    assert follower.stats().reused_tokens_total == rank0.stats().reused_tokens_total > 0
    leader.close()
    follower.close()


def test_a_refused_submit_is_not_replayed(tiny: Path, monkeypatch):
    group = mx.distributed.init()
    monkeypatch.setattr(leader_module, "broadcast", lambda plan, _group: plan)
    health = ClusterHealth(2, seen={0, 1})
    leader = LeaderEngine(build_engine(tiny, "t", {**ENGINE, "rows": 1}, group), group, health)
    leader.submit(job("a", [1, 2, 3], max_tokens=4))
    with pytest.raises(Busy):
        leader.submit(job("b", [1, 2, 3], max_tokens=4))
    with pytest.raises(InvalidRequest):
        leader.submit(dataclasses.replace(job("c", [1], max_tokens=4), prompt=()))
    assert [call.job.job_id for call in leader._calls] == ["a"]
    assert leader.info.embedding is None  # no embedding path across ranks
    health.fail("rank 1 lost (silent)", 1)  # the heartbeat's verdict: the next step fails before it runs
    with pytest.raises(EngineFailure, match="rank 1 lost"):
        leader.step()
    leader.close()
