"""One named account of an engine's memory, the same parts on every engine.

`total` is the allocator's own figure (MLX: `mx.get_active_memory()`; llama.cpp: the buffers it
allocated, weights included). The named parts explain it:

- weights: the model's parameters.
- kv: attention KV, every block or cell allocated, those the prefix pool holds included (the pool's KV
  is shared with the rows it came from, so it is counted once, here).
- state: recurrent state (GatedDeltaNet / Mamba / conv) of the rows.
- pool: bytes only the prefix pool holds: recurrent-state snapshots.
- scratch: activations and compute buffers. MLX: `total` minus the parts above (what a step keeps
  alive); llama.cpp: its compute and output buffers, as its log reports them.
- cache: MLX's cache of freed buffers, kept for reuse. It is *beside* `total` (MLX does not count it
  as active), so the process holds about total + cache; llama.cpp has none (0).

Engines put `MemoryAccount.as_dict()` in `EngineStats.memory`, plus `peak` (the allocator's high-water
mark) where known, and counts that are not bytes (`kv_blocks_used`, `kv_blocks_total`), which the
byte gauges skip.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

PARTS = ("weights", "kv", "state", "pool", "scratch", "cache")  # the named parts, in display order
BYTE_KINDS = (*PARTS, "total", "peak", "budget")  # memory keys that are bytes (others are counts)


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
        cls, total: int, *, weights: int, kv: int, state: int, pool: int, cache: int, budget: int = 0
    ) -> MemoryAccount:
        """An account whose scratch is what the allocator holds beyond the named parts (never < 0)."""
        named = weights + kv + state + pool
        return cls(weights, kv, state, pool, max(0, total - named), cache, total, budget)

    @property
    def named(self) -> int:
        """Bytes the named parts explain (scratch is a remainder on MLX, so it is left out)."""
        return self.weights + self.kv + self.state + self.pool

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def byte_kinds(memory: dict[str, int]) -> dict[str, int]:
    """The entries of an `EngineStats.memory` that are bytes, in display order."""
    return {k: memory[k] for k in BYTE_KINDS if k in memory}
