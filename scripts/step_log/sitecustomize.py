"""A diagnostic, never imported by kinfer itself: log every MLX engine step of a server started with this
folder first on PYTHONPATH (Python imports `sitecustomize` at start-up).

    KINFER_STEP_HOOK=steps.log KINFER_STEP_SLOW=0 PYTHONPATH=scripts/step_log:$PWD kinfer --headless ...

One line per step slower than KINFER_STEP_SLOW seconds (default 0.08; 0: every step): wall time, the
step's ms, prompt positions prefilled, rows decoding and filling, the step timer's phases (build,
launch, wait, other) and the engine thread's CPU time (`cpu`, `cpu_launch`; both
kinfer/engines/mlx/step_timer.py), `gc`: the milliseconds any thread spent collecting garbage during
the step, `launched_mb`: what the allocator grew by while the step's passes were launched (a copy an
array could not be updated in place shows here: scripts/probe_donation.py), and `reads`: how each
pass read its rows' recurrent state. KINFER_STEP_PROFILE=1 adds a cProfile of each slow step,
KINFER_STEP_MEMORY=1 the memory account's parts in MB. KINFER_STEP_KERNELS=N@TOKENS (CUDA, torch
installed) records N steps kernel by kernel, each apart (profile_steps.py's window), from the first step
a row has TOKENS tokens in (N@sSTEP: from the hook's STEP-th step); their host CUDA calls, launched
graphs and new graphs go into the log after the N steps. scripts/trace_ttft.py reads such a log beside
its own request timeline. KINFER_STEP_SYNC=1 waits for the device to finish everything before each
pass is launched (a test, not a setting: it gives up the overlap of host and device work): every
update then finds its array free of earlier work and is made in place (scripts/probe_donation.py), so
if new CUDA graphs still appear mid-serving, timing did not make them.
KINFER_GC_LOG=gc.log (alone or beside it) logs every garbage collection of the
process, with its pid and milliseconds. This is how the H200's burst steps were found to spend 100-300
ms in `mx.async_eval` (docs/benchmarks.md, 2026-12-02).
"""

from __future__ import annotations

import contextlib
import io
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

    collections = _watch_collections()
    window = _kernel_window(out)
    reads = _watch_reads()
    if os.environ.get("KINFER_STEP_SYNC"):
        _sync_before_each_pass(mlx_engine.MlxEngine)

    def logged_step(self):
        if not isinstance(self.step_timer, StepTimer):
            self.step_timer = StepTimer()
        profiler = cProfile.Profile() if profile else None
        if window is not None:
            window.maybe_begin(self)
        reads.clear()  # the load's warm-up passes read state too, outside any step
        began = time.perf_counter()
        if profiler:
            profiler.enable()
        with window.mark() if window is not None else contextlib.nullcontext():
            updates = step(self)
        if profiler:
            profiler.disable()
        seconds = time.perf_counter() - began
        step_reads = reads[:]
        if window is not None:
            window.after(self, seconds)
        phases = self.step_timer.steps[-1] if self.step_timer.steps else {}
        self.step_timer.steps.clear()
        if seconds >= slow:
            active = [row for row in self._slots if row is not None]
            ready = sum(1 for row in active if row.ready)
            laps = " ".join(f"{name}={value * 1000:.1f}" for name, value in phases.items())
            collected = collections.within(began, began + seconds)
            out.write(
                f"{time.time():.4f} step {seconds * 1000:.1f}ms prefill={self._step_prefill} "
                f"decoding={ready} filling={len(active) - ready} updates={len(updates)} {laps} "
                f"gc={collected * 1000:.1f} launched_mb={self._dispatched_bytes / 2**20:.1f} "
                f"reads={','.join(step_reads) or '-'}"
                + (" " + _parts(self.stats().memory) if memory else "")
                + "\n"
            )
            if profiler:
                text = io.StringIO()
                pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(25)
                out.write(text.getvalue())
        return updates

    mlx_engine.MlxEngine.step = logged_step


def _sync_before_each_pass(engine_class) -> None:
    """Each pass launched only once the device has finished (and MLX released) all earlier work."""
    import mlx.core as mx

    launch = engine_class._launch

    def synced(self, outputs):
        mx.synchronize()
        return launch(self, outputs)

    engine_class._launch = synced


def _watch_reads() -> list[str]:
    """How each pass of a step read its rows' recurrent state (state.StateLedger.begin): `steady` (the
    last pass's output as it is), `direct` (one output, in order), `gather<outputs>` (+`z`: a zero row),
    `fresh`; filled as the step runs, emptied by the caller."""
    from kinfer.engines.mlx import state

    reads: list[str] = []
    begin = state.StateLedger.begin

    def recorded(self, slots):
        read, sources = begin(self, slots)
        if read.keys == (read.key,):  # the steady step writes where it reads
            kind = "steady"
        elif read.fresh:
            kind = "fresh"
        elif read.index is None:
            kind = "direct"
        else:
            kind = f"gather{len(read.keys)}" + ("z" if read.zero else "")
        reads.append(f"{kind}{read.rows}")
        return read, sources

    state.StateLedger.begin = recorded
    return reads


class _HookWindow:
    """profile_steps.py's KernelWindow over a server's steps: from the first step a row has `tokens`
    tokens in, or from the `from_step`-th step."""

    def __init__(self, steps: int, tokens: int, out, *, from_step: int | None = None) -> None:
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # scripts/
        import profile_steps

        self.window = profile_steps.KernelWindow(steps, per_step=True)
        self.tokens, self.out, self.log = tokens, out, []
        self.from_step, self.steps = from_step, 0

    def maybe_begin(self, engine) -> None:
        self.steps += 1
        if self.from_step is not None:
            if self.steps >= self.from_step:
                self.window.begin()
        elif any(row is not None and row.fed >= self.tokens for row in engine._slots):
            self.window.begin()

    def mark(self):
        return self.window.mark()

    def after(self, engine, seconds: float) -> None:
        if self.window.open is None:
            return
        self.log.append(
            {
                "ms": seconds * 1000,
                "prefill": engine._step_prefill,
                "fed": max((row.fed for row in engine._slots if row is not None), default=0),
            }
        )
        buffered = io.StringIO()
        with contextlib.redirect_stdout(buffered):
            self.window.after_step(self.log)
        self.out.write(buffered.getvalue())


def _kernel_window(out) -> _HookWindow | None:
    spec = os.environ.get("KINFER_STEP_KERNELS")
    if not spec:
        return None
    steps, at = spec.split("@")
    if at.startswith("s"):
        return _HookWindow(int(steps), 0, out, from_step=int(at[1:]))
    return _HookWindow(int(steps), int(at), out)


class _Collections:
    """The garbage collections of the last few seconds, any thread's: (began, ended) perf_counter pairs."""

    def __init__(self) -> None:
        import collections

        self.spans: collections.deque[tuple[float, float]] = collections.deque(maxlen=256)
        self._began = 0.0

    def note(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.spans.append((self._began, time.perf_counter()))

    def within(self, began: float, ended: float) -> float:
        """Seconds of collection between `began` and `ended`."""
        return sum(max(0.0, min(end, ended) - max(start, began)) for start, end in list(self.spans))


def _watch_collections() -> _Collections:
    import gc

    watch = _Collections()
    gc.callbacks.append(watch.note)
    return watch


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
