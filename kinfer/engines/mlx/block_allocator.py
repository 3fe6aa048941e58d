"""KV block ids with reference counts, for the MLX engine's paged attention (kv.py).

Pure bookkeeping, no arrays: a row's blocks and the prefix pool's entries may hold the same block; a
block is free again once the last holder gives it back.
"""

from __future__ import annotations


class BlockAllocator:
    """Block ids with reference counts: rows and prefix-pool entries may hold the same block."""

    def __init__(self) -> None:
        self.total = 0
        self._free: list[int] = []
        self._refs: list[int] = []

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def used(self) -> int:
        return self.total - len(self._free)

    def add(self, n: int) -> None:
        """Register `n` new blocks (the pools grew)."""
        self._free.extend(range(self.total + n - 1, self.total - 1, -1))
        self._refs.extend([0] * n)
        self.total += n

    def take(self, n: int) -> list[int]:
        if n > len(self._free):
            raise MemoryError(f"{n} KV blocks wanted, {len(self._free)} free")
        ids = [self._free.pop() for _ in range(n)]
        for i in ids:
            self._refs[i] = 1
        return ids

    def hold(self, ids: list[int]) -> None:
        for i in ids:
            self._refs[i] += 1

    def release(self, ids: list[int]) -> None:
        for i in ids:
            self._refs[i] -= 1
            if self._refs[i] == 0:
                self._free.append(i)
