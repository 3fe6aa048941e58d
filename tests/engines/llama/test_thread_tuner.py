"""The thread tuner picks the decode thread count from step times: scripted timings, no llama.cpp.

The timings are shaped like the ones measured on a 2-core VM (bundled SmolLM2, one row): quiet, a step
took ~15 ms on 2 threads and ~25 ms on 1; beside one busy process per core, ~120 ms on 2 and ~30 ms on 1.
The engine thread's CPU time over a step's wall time was 1.0 quiet on either count (the waits spin),
0.2-0.5 on 2 threads and 0.35-0.75 on 1 beside the busy processes.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from kinfer.engines.llama.thread_tuner import ThreadTuner, TunerConfig, candidate_counts

QUIET = {2: 0.015, 1: 0.025}
BUSY = {2: 0.120, 1: 0.030}
QUIET_LOAD = {2: 1.0, 1: 1.0}
BUSY_LOAD = {2: 0.4, 1: 0.65}

Timing = Callable[[int, int], float]  # (threads, batch tokens) -> step seconds


def drive(
    tuner: ThreadTuner,
    timing: Timing,
    seconds: float,
    tokens: Callable[[], int] = lambda: 1,
    load: Callable[[int], float] | None = None,
) -> dict:
    """Run decode steps for `seconds` of decode time the way the engine does: ask, run, record
    (`load(threads)`: the engine thread's CPU share of the step; None: not measured). Returns the
    seconds spent at each thread count and the switches made."""
    spent: dict[int, float] = {}
    switches = []
    clock = 0.0
    while clock < seconds:
        threads, size = tuner.threads, tokens()
        took = timing(threads, size)
        clock += took
        spent[threads] = spent.get(threads, 0.0) + took
        cpu = None if load is None else took * load(threads)
        if (switch := tuner.record(threads, size, took, cpu)) is not None:
            switches.append(switch)
    return {"spent": spent, "switches": switches}


def table(speeds: dict[int, float]) -> Timing:
    return lambda threads, tokens: speeds[threads] * tokens**0.5


def noisy(speeds: dict[int, float], seed: int, spread: float = 0.25, spikes: float = 0.05) -> Timing:
    """Each step off by a random factor, and now and then one 3x slower (a descheduled thread)."""
    rng = random.Random(seed)

    def timing(threads: int, tokens: int) -> float:
        took = table(speeds)(threads, tokens) * rng.lognormvariate(0, spread)
        return took * 3 if rng.random() < spikes else took

    return timing


def two_cores() -> ThreadTuner:
    config = TunerConfig.for_threads(2)
    assert config is not None
    return ThreadTuner(config)


def test_the_candidates_are_every_core_then_half_then_one():
    assert candidate_counts(1) == (1,)
    assert candidate_counts(2) == (2, 1)
    assert candidate_counts(8) == (8, 4, 1)
    assert TunerConfig.for_threads(1) is None
    with pytest.raises(ValueError):
        TunerConfig((2, 2))


def test_a_quiet_machine_stays_on_every_thread_and_probing_costs_little():
    tuner = two_cores()
    run = drive(tuner, table(QUIET), seconds=120)
    assert run["switches"] == [] and tuner.current == 2
    assert tuner.probes > 10  # it kept checking...
    # ...at a cost of under 3 % of the time (the time on the slower count, as a share of all)
    assert run["spent"][1] / sum(run["spent"].values()) < 0.03


@pytest.mark.parametrize(("quiet_s", "slow_steps"), [(0, 8), (1, 6), (10, 6), (100, 6)])
def test_a_busy_machine_moves_to_one_thread_within_a_second(quiet_s, slow_steps):
    """Busy from the start, the first probe comes after one window of steps; however long it ran
    quiet (probes backed off), four slow steps in a row call a probe at once. A probe that takes a
    quarter of the time switches without waiting for a confirmation."""
    tuner = two_cores()
    drive(tuner, table(QUIET), seconds=quiet_s)
    run = drive(tuner, table(BUSY), seconds=1.5)  # (the next probe of two threads comes later)
    assert tuner.current == 1
    assert [(s.before, s.after) for s in run["switches"]] == [(2, 1)]
    assert run["switches"][0].ratio == pytest.approx(BUSY[1] / BUSY[2])
    assert run["spent"][2] <= slow_steps * BUSY[2] + 1e-9


def test_contention_that_begins_right_after_a_probe_is_seen_within_four_steps():
    """The baseline a losing probe leaves is fresh: four steps each twice as slow are enough."""
    tuner = two_cores()
    drive(tuner, table(QUIET), seconds=1)
    while tuner.probes == 0 or tuner.threads != tuner.current:  # until a probe has just ended
        threads = tuner.threads
        tuner.record(threads, 1, QUIET[threads])
    run = drive(tuner, table(BUSY), seconds=1)  # (the next probe of two threads comes later)
    assert tuner.current == 1 and run["spent"][2] <= 4 * BUSY[2] + 1e-9


def test_on_a_busy_machine_a_probe_of_every_thread_stops_after_two_steps():
    """Two threads beside busy processes are four times slower: two steps in a row say enough."""
    tuner = two_cores()
    drive(tuner, table(BUSY), seconds=10)
    probes = tuner.probes
    run = drive(tuner, table(BUSY), seconds=120)
    assert tuner.probes > probes and tuner.current == 1
    assert run["spent"][2] == pytest.approx((tuner.probes - probes) * 2 * BUSY[2])
    assert run["spent"][2] / sum(run["spent"].values()) < 0.03


def test_one_slow_step_is_a_hiccup_not_a_loss():
    """On one thread of a nearly quiet machine, two threads are faster but now and then one of their
    steps is hit hard (another process woke up): the probe still wins and the tuner comes back."""
    tuner = two_cores()
    drive(tuner, table(BUSY), seconds=10)
    assert tuner.current == 1
    steps = iter(range(1_000_000))
    hiccups = lambda threads, tokens: (0.100 if next(steps) % 5 == 0 else 0.016) if threads == 2 else 0.024  # noqa: E731
    drive(tuner, hiccups, seconds=20)
    assert tuner.current == 2


def test_when_the_contention_ends_it_comes_back_to_every_thread():
    tuner = two_cores()
    drive(tuner, table(BUSY), seconds=10)
    assert tuner.current == 1
    run = drive(tuner, table(QUIET), seconds=10)  # at most the longest wait between probes, and one more
    assert tuner.current == 2
    assert [(s.before, s.after) for s in run["switches"]] == [(1, 2)]


def test_when_the_core_is_its_own_again_it_comes_back_at_once():
    """On one thread beside busy processes the engine thread gets a share of a core; when it gets all
    of it (the CPU time of a step equals its wall time) the contention ended: probe every thread now."""
    tuner = two_cores()
    drive(tuner, table(BUSY), seconds=30, load=BUSY_LOAD.get)
    assert tuner.current == 1
    run = drive(tuner, table(QUIET), seconds=2, load=QUIET_LOAD.get)
    assert tuner.current == 2
    assert run["spent"][1] < 0.5  # ~12 steps, not the ~7 s the probe interval alone takes


@pytest.mark.parametrize("seed", range(5))
def test_noise_does_not_flap(seed):
    """Steps off by +-25 % and one in twenty three times slower: the faster count keeps winning."""
    quiet, busy = two_cores(), two_cores()
    rng = random.Random(seed)
    run = drive(quiet, noisy(QUIET, seed), seconds=120, load=lambda _: 1 - abs(rng.gauss(0, 0.1)))
    assert quiet.switches == 0 and quiet.current == 2
    # noise buys few extra probes (quiet and steady: 1.3 %, test above; this noise: 2.4-3.4 %)
    assert run["spent"][1] / sum(run["spent"].values()) < 0.04
    drive(busy, noisy(BUSY, seed), seconds=120, load=lambda n: BUSY_LOAD[n] + rng.uniform(-0.2, 0.2))
    assert busy.switches == 1 and busy.current == 1


def batch_sizes(seed: int) -> Callable[[], int]:
    """Rows come and go: runs of 5-40 steps at 1, 4 or 16 rows."""
    rng = random.Random(seed)
    left, size = 0, 1

    def next_size() -> int:
        nonlocal left, size
        if left == 0:
            left, size = rng.randint(5, 40), rng.choice((1, 4, 16))
        left -= 1
        return size

    return next_size


@pytest.mark.parametrize("seed", range(3))
def test_steps_of_different_batch_sizes_are_not_compared(seed):
    """A 16-row step takes four times a 1-row one on any count here, so a probe that ran small batches
    must not look faster than the current count's large ones."""
    quiet = two_cores()
    drive(quiet, table(QUIET), seconds=60, tokens=batch_sizes(seed))
    assert quiet.switches == 0 and quiet.probes > 0
    busy = two_cores()
    drive(busy, table(BUSY), seconds=60, tokens=batch_sizes(seed))
    assert busy.current == 1


def test_a_step_at_a_count_it_did_not_ask_for_teaches_it_nothing():
    tuner = two_cores()
    for _ in range(1000):
        assert tuner.record(1, 1, 0.001) is None  # far faster, but the tuner asked for 2
    assert tuner.current == 2 and tuner.threads == 2 and tuner.probes == 0


def test_a_bigger_machine_tries_half_its_cores_too():
    config = TunerConfig.for_threads(8)
    assert config is not None
    tuner = ThreadTuner(config)
    # busy: half the cores is the best, one thread better than all of them
    speeds = {8: 0.100, 4: 0.020, 1: 0.040}
    drive(tuner, table(speeds), seconds=30)
    assert tuner.current == 4
