"""The MLX engine's memory account (kinfer/engines/memory_account.py) and its run-time budget check.

Everything the engine allocates goes through MLX's allocator, so `mx.get_active_memory()` is the
total; the parts are read from the arrays that hold them, scratch is what the allocator grew by when the
running step was dispatched (its activations and logits), and what no part names is `unexplained`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import TYPE_CHECKING

import mlx.core as mx
from mlx.utils import tree_flatten

from kinfer.engines.budget import ram_total, resolve_budget
from kinfer.engines.memory_account import MemoryAccount

log = logging.getLogger(__name__)

WARN_INTERVAL_S = 60.0  # over the budget, one warning a minute at most
_warned = [-WARN_INTERVAL_S]  # when the last over-budget warning was logged (monotonic seconds)

if TYPE_CHECKING:
    from kinfer.engines.mlx.kv import PagedLayer
    from kinfer.engines.mlx.prefix import PrefixPool
    from kinfer.engines.mlx.state import StateSlots


def weight_bytes(model) -> int:
    """Bytes of the model's parameters (after projection fusing, which replaces the pieces it joins)."""
    if model is None:
        return 0
    return sum(v.nbytes for _, v in tree_flatten(model.parameters()) if isinstance(v, mx.array))


def mlx_account(
    *,
    weights: int,
    paged: list[PagedLayer],
    recurrent: list[StateSlots],
    pool: PrefixPool | None,
    in_flight: int,
    budget: int,
) -> MemoryAccount:
    return MemoryAccount.from_allocator(
        mx.get_active_memory(),
        weights=weights,
        kv=sum(layer.nbytes for layer in paged),
        state=sum(layer.nbytes for layer in recurrent),
        pool=pool.state_bytes if pool is not None else 0,
        cache=mx.get_cache_memory(),
        in_flight=in_flight,
        budget=budget,
    )


def over_budget(budget: int) -> bool:
    """True when the allocator holds more than `budget` (0: no budget), after MLX's cache of freed
    buffers is given back: a new row must wait for running ones to finish instead of growing further."""
    if budget <= 0:
        return False
    if mx.get_active_memory() + mx.get_cache_memory() <= budget:
        return False
    mx.clear_cache()
    active = mx.get_active_memory()
    if active <= budget:
        return False
    now = time.monotonic()
    if now - _warned[0] >= WARN_INTERVAL_S:  # a user seeing fewer rows busy should learn why
        _warned[0] = now
        log.warning(
            "MLX holds %.2f GiB, over the memory budget of %.2f GiB: new replies wait for running ones "
            "(--memory-budget)",
            active / 2**30,
            budget / 2**30,
        )
    return True


def gpu_memory() -> tuple[int, int | None]:
    """(total bytes, free bytes or None) of the GPU MLX computes on; (0, None) where it reports neither.

    The backends name them apart in `mx.device_info()`: Metal's `memory_size` (unified memory, no free
    figure), CUDA's `total_memory` and `free_memory` (NVML's, so other processes' use counts). Reading
    only `memory_size` took a CUDA machine's host RAM for its GPU's memory."""
    info = mx.device_info() if hasattr(mx, "device_info") else {}
    total = int(info.get("memory_size") or info.get("total_memory") or 0)
    free = info.get("free_memory")
    return total, (int(free) if free is not None and total else None)


def device_budget(setting_gb: float, gpu: bool) -> int:
    """The memory budget in bytes (kinfer/engines/budget.py): of unified memory on Apple silicon, of
    the GPU's memory on CUDA, of RAM on a CPU."""
    total = gpu_memory()[0] if gpu else 0
    if not total:
        return resolve_budget(setting_gb, total=ram_total(), kind="ram")
    kind = "unified" if mx.metal.is_available() else "cuda"
    return resolve_budget(setting_gb, total=total, kind=kind)


PEAK_WINDOW_S = 2.0  # how far back `peak_recent` looks (a benchmark samples every half second)


class PeakWindow:
    """MLX's peak active memory over the process's life and over the last `window_s` seconds. MLX keeps
    one high-water mark that only ever grows, so a server's reading after its load (the warm-up) and a
    benchmark's first levels says nothing of the level it runs now: the engine thread takes the mark
    after each step and starts it again (`sample`), and readers on other threads ask `recent`."""

    def __init__(self, window_s: float = PEAK_WINDOW_S) -> None:
        self.window_s = window_s
        self._lifetime = 0
        self._marks: deque[tuple[float, int]] = deque()
        self._lock = threading.Lock()

    def sample(self, now: float | None = None) -> None:
        """The engine thread's: the mark since the last sample, kept; MLX's own started again."""
        now = time.monotonic() if now is None else now
        peak = mx.get_peak_memory()
        mx.reset_peak_memory()
        with self._lock:
            self._lifetime = max(self._lifetime, peak)
            self._marks.append((now, peak))
            while self._marks and self._marks[0][0] < now - self.window_s:
                self._marks.popleft()

    def restart(self) -> None:
        """Keep the mark so far for the lifetime only (a load and its warm-up are no step's)."""
        peak = mx.get_peak_memory()
        mx.reset_peak_memory()
        with self._lock:
            self._lifetime = max(self._lifetime, peak)

    def recent(self, now: float | None = None) -> int:
        """The highest active memory of the last `window_s` seconds (and since the last sample)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            kept = [peak for at, peak in self._marks if at >= now - self.window_s]
        return max([mx.get_active_memory(), mx.get_peak_memory(), *kept])

    @property
    def lifetime(self) -> int:
        with self._lock:
            return max(self._lifetime, mx.get_peak_memory())

    def as_dict(self) -> dict[str, int]:
        """The account's two high-water marks: `peak` (the process's life) and `peak_recent`."""
        return {"peak": self.lifetime, "peak_recent": self.recent()}
