"""The engine step's host-time breakdown (step_timer.py), as the MLX engine bench's --breakdown reads it."""

from __future__ import annotations

import time

from kinfer.engines.mlx.step_timer import NO_TIMER, PHASES, StepTimer
from tests.engines.mlx.fixtures import *  # noqa: F403


def test_phases_add_up_to_the_step_and_the_rest_is_other():
    timer = StepTimer()
    timer.start()
    timer.lap("build")
    timer.lap("launch")
    timer.lap("build")  # a phase may come back (a constrained step's early read-back)
    timer.stop()
    (step,) = timer.steps
    assert set(step) == {*PHASES, "total", "cpu", "cpu_launch"}
    assert abs(sum(step[p] for p in PHASES) - step["total"]) < 1e-9
    assert timer.mean_ms()["steps"] == 1
    timer.lap("wait")  # outside a step: ignored
    assert len(timer.steps) == 1


def test_an_engine_steps_with_no_timer_by_default(make_mlx, tiny_qwen3):
    assert make_mlx(tiny_qwen3, self_check=False).step_timer is NO_TIMER


def test_the_breakdown_adds_up_to_the_step_time_seen_from_outside(make_mlx, tiny_qwen3):
    engine = make_mlx(tiny_qwen3, self_check=False)
    engine.step_timer = timer = StepTimer()
    for i in range(3):
        engine.submit(job(f"j{i}", [1 + i, 2, 3, 4, 5], max_tokens=12))  # noqa: F405
    outside = []
    while engine.has_work:
        began = time.perf_counter()
        engine.step()
        outside.append(time.perf_counter() - began)
    assert len(timer.steps) == len(outside) >= 12
    for step in timer.steps:
        assert abs(sum(step[p] for p in PHASES) - step["total"]) < 1e-9
    # the phases cover the whole step but the call itself (counted over all steps: no machine speed)
    inside = sum(step["total"] for step in timer.steps)
    assert 0.8 * sum(outside) <= inside <= sum(outside)
    # every step that decoded built a graph and launched it; steps after the first read tokens back
    assert all(step["build"] > 0 and step["launch"] > 0 for step in timer.steps[1:-1])
    mean = timer.mean_ms()
    assert mean["steps"] == len(outside) and mean["total"] > 0


def test_a_launch_that_waits_shows_less_cpu_time_than_wall_time():
    timer = StepTimer()
    timer.start()
    timer.lap("build")
    time.sleep(0.05)  # the engine thread blocked (the GIL held elsewhere, a lock): no CPU time
    timer.lap("launch")
    busy = time.perf_counter() + 0.02
    while time.perf_counter() < busy:  # working: CPU time
        pass
    timer.stop()
    (step,) = timer.steps
    assert step["launch"] >= 0.05 and step["cpu_launch"] < 0.02
    assert step["cpu"] >= 0.015 and step["cpu"] <= step["total"]
