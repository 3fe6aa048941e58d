"""Where an MLX engine step's host time goes, phase by phase (the engine bench's `--breakdown`).

The engine calls `start()` as a step begins, `lap(phase)` as each phase ends (the time since the
previous lap is that phase's) and `stop()` as the step ends (the time since the last lap is `other`), so
a step's phases add up to its total. Phases:

- build: Python building the lazy graphs (up to each pass's outputs handed to `mx.async_eval`)
- launch: inside `mx.async_eval`: MLX encoding each pass's graph and launching it on the device
- wait: the host waiting on the device (reading the previous step's tokens back)
- other: the rest (row bookkeeping, stop checks, detokenizing, updates)

A constrained row's step reads back early (MlxEngine._constrain): its masks and bookkeeping count as
build. Beside the phases' wall time a step records the engine thread's own CPU time: `cpu` over the
step, `cpu_launch` inside `mx.async_eval`, which releases the GIL. A launch far longer than its CPU time
waited (for the GIL back from another thread, a lock, the device) instead of working (encoding,
instantiating CUDA graphs). `NO_TIMER`, the engine's default, does nothing.
"""

from __future__ import annotations

import time

PHASES = ("build", "launch", "wait", "other")


class NoTimer:
    """The engine's timer when nothing measures it."""

    def start(self) -> None:
        pass

    def lap(self, phase: str, outputs: list | None = None) -> None:
        """`outputs`: with the "build" lap, the step's graph about to be launched (graph_ops.OpCounter)."""

    def stop(self) -> None:
        pass


NO_TIMER = NoTimer()


class StepTimer(NoTimer):
    """Records every step's seconds per phase (and `total`) in `steps`."""

    def __init__(self) -> None:
        self.steps: list[dict[str, float]] = []
        self._current: dict[str, float] | None = None
        self._began = self._last = 0.0

    def start(self) -> None:
        self._current = dict.fromkeys(PHASES, 0.0) | {"cpu_launch": 0.0}
        self._began = self._last = time.perf_counter()
        self._cpu_began = self._cpu_last = time.thread_time()

    def lap(self, phase: str, outputs: list | None = None) -> None:
        if self._current is not None:
            now, cpu = time.perf_counter(), time.thread_time()
            self._current[phase] += now - self._last
            if phase == "launch":
                self._current["cpu_launch"] += cpu - self._cpu_last
            self._last, self._cpu_last = now, cpu

    def stop(self) -> None:
        if self._current is not None:
            self.lap("other")
            self._current["total"] = self._last - self._began
            self._current["cpu"] = self._cpu_last - self._cpu_began
            self.steps.append(self._current)
            self._current = None

    def clear(self) -> None:
        self.steps.clear()

    def mean_ms(self) -> dict[str, float]:
        """Mean milliseconds per step of each phase and the total, and `steps`: how many steps."""
        count = len(self.steps)
        means = {
            key: 1000 * sum(step[key] for step in self.steps) / count if count else 0.0
            for key in (*PHASES, "total")
        }
        return {**means, "steps": float(count)}
