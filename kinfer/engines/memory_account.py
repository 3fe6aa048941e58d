"""One named account of an engine's memory, the same parts on every engine.

`total` is the allocator's own figure (MLX: `mx.get_active_memory()`; llama.cpp: the buffers it
allocated, weights included). The named parts explain it; what they leave is `unexplained` (a leak
shows there, growing):

- weights: the model's parameters.
- kv: attention KV, every block or cell allocated, those the prefix pool holds included (the pool's KV
  is shared with the rows it came from, so it is counted once, here).
- state: recurrent state (GatedDeltaNet / Mamba / conv) of the rows.
- pool: bytes only the prefix pool holds: recurrent-state snapshots.
- scratch: activations and compute buffers. MLX: the buffers of the pass in flight, as the allocator
  grew while the pass was dispatched (on a GPU MLX allocates a pass's buffers as it encodes it and
  gives them back as the pass finishes, so a long prefill pass can hold many layers' activations at
  once), at most what the parts above leave of `total`; llama.cpp: its compute and output buffers, as
  its log reports them.
- cache: MLX's cache of freed buffers, kept for reuse. It is *beside* `total` (MLX does not count it
  as active), so the process holds about total + cache; llama.cpp has none (0).

Engines put `MemoryAccount.as_dict()` in `EngineStats.memory`, plus `peak` (the allocator's high-water
mark) where known, `peak_recent` (its high-water mark over the last seconds, where the engine keeps
one: what a benchmark reads per level, as the lifetime mark holds the load and every level before),
and counts that are not bytes (`kv_blocks_used`, `kv_blocks_total`), which the byte gauges skip.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

# the parts, in display order: with `unexplained` they sum to `total`; `cache` is beside it
PARTS = ("weights", "kv", "state", "pool", "scratch", "unexplained", "cache")
# memory keys that are bytes (others are counts)
BYTE_KINDS = (*PARTS, "total", "peak", "peak_recent", "budget")


@dataclass(frozen=True)
class MemoryAccount:
    """Bytes by part; `total` is the allocator's figure, `budget` the engine's memory budget (0: none)."""

    weights: int = 0
    kv: int = 0
    state: int = 0
    pool: int = 0
    scratch: int = 0
    cache: int = 0
    total: int = 0
    budget: int = 0

    @classmethod
    def from_allocator(
        cls,
        total: int,
        *,
        weights: int,
        kv: int,
        state: int,
        pool: int,
        cache: int,
        in_flight: int,
        budget: int = 0,
    ) -> MemoryAccount:
        """An account of the allocator's `total` whose scratch is `in_flight` (the bytes the allocator
        grew by when the running pass was dispatched), capped by what the other parts leave: a pass
        that has finished since gave its buffers back."""
        held = weights + kv + state + pool
        return cls(weights, kv, state, pool, min(in_flight, max(0, total - held)), cache, total, budget)

    @property
    def named(self) -> int:
        """Bytes the named parts explain (MLX's cache is beside `total`, not in it)."""
        return self.weights + self.kv + self.state + self.pool + self.scratch

    @property
    def unexplained(self) -> int:
        """What the allocator holds that no part names (0 when they explain it all)."""
        return max(0, self.total - self.named)

    def as_dict(self) -> dict[str, int]:
        return {**asdict(self), "unexplained": self.unexplained}


def byte_kinds(memory: dict[str, int]) -> dict[str, int]:
    """The entries of an `EngineStats.memory` that are bytes, in display order."""
    return {k: memory[k] for k in BYTE_KINDS if k in memory}
