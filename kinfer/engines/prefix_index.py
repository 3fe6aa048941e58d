"""Bookkeeping of the prefix pool, shared by both engines: which saved prompt shares the longest
token prefix with a new one, and which entry to evict (least recently used).

The engines keep the actual state (llama.cpp sequence ids, MLX caches); this index maps an entry key
to the tokens that state holds.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PrefixMatch:
    key: Hashable
    shared: int  # tokens the new prompt shares with the entry, from the start


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    # compare in blocks first: prompts of agents share thousands of tokens
    block = 256
    while i + block <= n and tuple(a[i : i + block]) == tuple(b[i : i + block]):
        i += block
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PrefixIndex:
    """Entries in LRU order; lookups return the entry sharing the longest prefix."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[Hashable, tuple[int, ...]] = OrderedDict()
        self.lookups = 0
        self.hits = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def tokens(self, key: Hashable) -> tuple[int, ...]:
        return self._entries[key]

    def keys(self) -> list[Hashable]:
        """Least recently used first."""
        return list(self._entries)

    def put(self, key: Hashable, tokens: Sequence[int]) -> None:
        self._entries[key] = tuple(tokens)
        self._entries.move_to_end(key)

    def remove(self, key: Hashable) -> None:
        self._entries.pop(key, None)

    def touch(self, key: Hashable) -> None:
        self._entries.move_to_end(key)

    def lru(self) -> Hashable | None:
        return next(iter(self._entries), None)

    def best(
        self, prompt: Sequence[int], *, exact_only: bool = False, min_shared: int = 1
    ) -> PrefixMatch | None:
        """The entry sharing the longest prefix with `prompt`.

        exact_only: the entry's whole token list must be a prefix of the prompt (recurrent state cannot
        be trimmed, so a partial match is useless to it). Never matches the whole prompt: at least one
        token must remain to be evaluated so the model yields logits.
        """
        self.lookups += 1
        best: PrefixMatch | None = None
        limit = len(prompt) - 1
        for key, tokens in self._entries.items():
            shared = common_prefix_length(tokens, prompt)
            if exact_only and shared < len(tokens):
                continue
            shared = min(shared, limit)
            if exact_only and shared < len(tokens):
                continue
            if shared >= min_shared and (best is None or shared > best.shared):
                best = PrefixMatch(key, shared)
        if best is not None:
            self.hits += 1
            self.touch(best.key)
        return best
