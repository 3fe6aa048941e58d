"""The MLX engine's prefix pool: recent prompts' KV blocks (and recurrent state snapshots) for reuse.

An entry is a token list, references to the KV blocks that hold those tokens, and, for models with
recurrent layers, a snapshot of every recurrent layer's state taken exactly at the end of the tokens.
Attention KV can be cut to any shared prefix; recurrent state only fits a prompt that continues the
entry's whole token list, so such models match exact entries only. The bookkeeping (longest shared
prefix, least recently used) is `PrefixIndex`'s.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from kinfer.engines.mlx.block_allocator import BlockAllocator
from kinfer.engines.mlx.kv import BLOCK
from kinfer.engines.mlx.state import Snapshot
from kinfer.engines.prefix_index import PrefixIndex

MIN_SHARED = 4  # shorter matches are not worth a block copy
STATE_BYTES = 2 << 30  # recurrent-state snapshots kept at most (a 0.8B hybrid model: ~19 MB each)


@dataclass
class PoolEntry:
    tokens: tuple[int, ...]
    blocks: list[int]  # the pool's references: ceil(len(tokens) / BLOCK) blocks
    states: list[Snapshot] | None  # one snapshot per recurrent layer, or None for attention-only models
    state_bytes: int = 0


class PrefixPool:
    """Saved prefixes, least recently used evicted first (by count, or when KV blocks run short)."""

    def __init__(
        self, allocator: BlockAllocator, capacity: int, *, exact_only: bool, state_bytes: int = STATE_BYTES
    ) -> None:
        self._alloc = allocator
        self.exact_only = exact_only
        self.max_state_bytes = state_bytes
        self.state_bytes = 0
        self.index = PrefixIndex(capacity)
        self._entries: dict[int, PoolEntry] = {}
        self._keys = itertools.count()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def lookups(self) -> int:
        return self.index.lookups

    @property
    def hits(self) -> int:
        return self.index.hits

    def lookup(self, prompt: tuple[int, ...]) -> tuple[PoolEntry, int] | None:
        """The entry sharing the longest usable prefix with `prompt`, and that prefix's length."""
        match = self.index.best(prompt, exact_only=self.exact_only, min_shared=MIN_SHARED)
        if match is None:
            return None
        return self._entries[match.key], match.shared

    def save(self, tokens: tuple[int, ...], blocks: list[int], states: list[Snapshot] | None) -> None:
        """Keep `tokens` (held in `blocks`, which the pool now also references)."""
        if len(tokens) < MIN_SHARED:
            return
        needed = blocks[: (len(tokens) + BLOCK - 1) // BLOCK]
        for key in list(self.index.keys()):
            old = self.index.tokens(key)
            redundant = old == tokens or (not self.exact_only and tokens[: len(old)] == old)
            if redundant:
                self._drop(key)
        self._alloc.hold(needed)
        key = next(self._keys)
        size = sum(a.nbytes for snap in states or () for a in snap if a is not None)
        self._entries[key] = PoolEntry(tokens, list(needed), states, size)
        self.state_bytes += size
        self.index.put(key, tokens)
        while len(self.index) > self.index.capacity or (
            self.state_bytes > self.max_state_bytes and len(self.index) > 1
        ):
            self.evict_one()

    def evict_one(self) -> bool:
        """Drop the least recently used entry; False when the pool is empty."""
        key = self.index.lru()
        if key is None:
            return False
        self._drop(key)
        return True

    def clear(self) -> None:
        while self.evict_one():
            pass

    def _drop(self, key) -> None:
        entry = self._entries.pop(key)
        self.index.remove(key)
        self._alloc.release(entry.blocks)
        self.state_bytes -= entry.state_bytes
