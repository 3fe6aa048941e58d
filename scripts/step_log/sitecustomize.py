"""A diagnostic, never imported by kinfer itself: log every MLX engine step of a server started with this
folder first on PYTHONPATH (Python imports `sitecustomize` at start-up).

    KINFER_STEP_HOOK=steps.log KINFER_STEP_SLOW=0 PYTHONPATH=scripts/step_log:$PWD kinfer --headless ...

One line per step slower than KINFER_STEP_SLOW seconds (default 0.08; 0: every step): wall time, the
step's ms, prompt positions prefilled, rows decoding and filling, and the step timer's phases (build,
launch, wait, other; kinfer/engines/mlx/step_timer.py). KINFER_STEP_PROFILE=1 adds a cProfile of each
slow step, KINFER_STEP_MEMORY=1 the memory account's parts in MB. scripts/trace_ttft.py reads such a
log beside its own request timeline. KINFER_GC_LOG=gc.log (alone or beside it) logs every garbage
collection of the process, with its pid and milliseconds. This is how the H200's burst steps were
found to spend 100-300 ms in `mx.async_eval` (docs/benchmarks.md, 2026-12-02).
"""

from __future__ import annotations

import os
import sys
import threading
import time


def _install() -> None:
    import cProfile
    import io
    import pstats

    from kinfer.engines.mlx import engine as mlx_engine
    from kinfer.engines.mlx.step_timer import StepTimer

    step = mlx_engine.MlxEngine.step
    out = open(os.environ["KINFER_STEP_HOOK"], "a", buffering=1)  # noqa: SIM115  (lives as long as the server)
    slow = float(os.environ.get("KINFER_STEP_SLOW", "0.08"))
    profile = bool(os.environ.get("KINFER_STEP_PROFILE"))
    memory = bool(os.environ.get("KINFER_STEP_MEMORY"))  # the memory account's parts, in MB

    def logged_step(self):
        if not isinstance(self.step_timer, StepTimer):
            self.step_timer = StepTimer()
        profiler = cProfile.Profile() if profile else None
        began = time.perf_counter()
        if profiler:
            profiler.enable()
        updates = step(self)
        if profiler:
            profiler.disable()
        seconds = time.perf_counter() - began
        phases = self.step_timer.steps[-1] if self.step_timer.steps else {}
        self.step_timer.steps.clear()
        if seconds >= slow:
            active = [row for row in self._slots if row is not None]
            ready = sum(1 for row in active if row.ready)
            laps = " ".join(f"{name}={value * 1000:.1f}" for name, value in phases.items())
            out.write(
                f"{time.time():.4f} step {seconds * 1000:.1f}ms prefill={self._step_prefill} "
                f"decoding={ready} filling={len(active) - ready} updates={len(updates)} {laps}"
                + (" " + _parts(self.stats().memory) if memory else "")
                + "\n"
            )
            if profiler:
                text = io.StringIO()
                pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(25)
                out.write(text.getvalue())
        return updates

    mlx_engine.MlxEngine.step = logged_step


def _parts(account: dict) -> str:
    keys = ("total", "peak_recent", "scratch", "unexplained", "pool", "state", "kv", "cache")
    return " ".join(f"{key}={account.get(key, 0) / 2**20:.0f}" for key in keys)


def _install_once_imported() -> None:
    # the server imports the engine module well before it loads a model; patch the class once it exists
    for _ in range(3000):
        if "kinfer.engines.mlx.engine" in sys.modules:
            _install()
            return
        time.sleep(0.02)


def _log_collections(path: str) -> None:
    """One line per garbage collection: its generation, milliseconds, and for a full one the objects
    the collector tracks after it (scheduler/heap.py freezes what a load leaves alive)."""
    import gc

    out = open(path, "a", buffering=1)  # noqa: SIM115  (lives as long as the process)
    began = [0.0]

    def note(phase: str, info: dict) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
            return
        gen, ms = info["generation"], (time.perf_counter() - began[0]) * 1000
        tracked = len(gc.get_objects()) if gen == 2 else 0
        out.write(f"{time.time():.3f} pid={os.getpid()} gen={gen} ms={ms:.2f} tracked={tracked}\n")

    gc.callbacks.append(note)


if os.environ.get("KINFER_STEP_HOOK"):
    threading.Thread(target=_install_once_imported, daemon=True).start()
if os.environ.get("KINFER_GC_LOG"):
    _log_collections(os.environ["KINFER_GC_LOG"])
