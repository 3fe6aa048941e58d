"""Recurrent state (GatedDeltaNet, Mamba, conv caches) of every row.

mlx-lm's recurrent layers keep their state in an `ArraysCache` whose arrays have the batch on axis 0.
A `StateView` stands in for the ArraysCache during one forward pass: it hands each layer its rows'
state and keeps the new state the layer returns.

A row's state is never written into an array of every slot: it stays where the last pass that ran the
row left it (that pass's output, at the row's entry). Scattering each pass's new state into a
[slots, ...] array, as kinfer first did, copied the whole array every pass: the gather that read the
pass's rows held the array's buffer, so MLX could not update it in place (GBs a step for a 0.8B
hybrid model sized for 256 rows, and as much memory on top of the state). Now a decode pass over the
rows of the last one reads its output as is, a changed batch gathers only its own rows, and the state
held follows the rows that run, not the slots.

Every recurrent layer of a pass runs for the same rows, so where each row's state lies is one record
for the whole model (`StateLedger`); each layer (`StateSlots`) keeps its arrays. Unlike attention KV,
this state cannot be trimmed to a shorter prefix, so the prefix pool keeps exact snapshots
(`StateSlots.snapshot`, `StateLedger.restore`).
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

Snapshot = list[mx.array | None]
Like = tuple[tuple[int, ...], mx.Dtype]  # one row's state: shape past the batch axis, dtype


@dataclass(frozen=True)
class PassRead:
    """Where a pass's rows find their state, the same for every recurrent layer.

    `keys`: the outputs the rows' states lie in; `index`: each entry's row in those outputs laid end to
    end (then one zero row when `zero`), None when the pass reads the one output as it is; `fresh`: no
    entry has a state yet (all start at zero)."""

    key: int  # the output this pass writes
    rows: int
    keys: tuple[int, ...]
    lengths: tuple[int, ...]  # rows of each output in `keys`
    index: mx.array | None
    zero: bool
    fresh: bool


class StateLedger:
    """Which output holds each slot's state (and at which entry), for all recurrent layers together."""

    def __init__(self) -> None:
        self.layers: list[StateSlots] = []
        # the padding rows' slot: their state is never kept, except by a pass of only padding (warm-up)
        self.scratch: int | None = None
        self._where: dict[int, tuple[int, int]] = {}  # slot -> (output key, entry)
        self._users: dict[int, int] = {}  # output key -> slots whose state it holds
        self._length: dict[int, int] = {}  # output key -> its rows
        self._next = 0
        # the last pass: its slots (bytes), output key, and the slots lying there once it began
        self._last: tuple[bytes, int, int] | None = None

    def add(self, layer: StateSlots) -> None:
        self.layers.append(layer)

    def location(self, slot: int) -> tuple[int, int] | None:
        return self._where.get(slot)

    def holds(self, key: int) -> bool:
        """Some row's state lies in output `key`."""
        return key in self._users

    def reset(self, slot: int) -> None:
        """A new reply takes the slot: its state starts at zero."""
        self._move(slot, None)

    def restore(self, slot: int, states: list[Snapshot]) -> None:
        """The slot's state becomes the snapshots (one per layer, as `StateSlots.snapshot` made them);
        they are never written to, so they are shared, not copied."""
        key = self._new_key(1)
        for layer, snap in zip(self.layers, states, strict=True):
            layer.outputs[key] = list(snap)
        self._move(slot, (key, 0))

    def begin(self, slots: np.ndarray) -> tuple[PassRead, list[list[Snapshot]]]:
        """Plan a pass over `slots` (one entry each; the scratch slot pads): where it reads, and each
        layer's source arrays, taken now since the pass's rows move to its own output at once."""
        same = self._same_as_last(slots)
        if same is not None:
            return same
        order = slots.tolist()
        padding = {j for j, slot in enumerate(order) if slot == self.scratch}
        if len(padding) == len(order):
            padding = set()  # a warm-up pass: the scratch slot runs as a row, so the next one gathers
        # (output key, entry) of each real entry; None: its state starts at zero
        entries = {j: self._where.get(slot) for j, slot in enumerate(order) if j not in padding}
        keys = tuple(dict.fromkeys(e[0] for e in entries.values() if e is not None))
        lengths = tuple(self._length[k] for k in keys)
        zero = None in entries.values()
        n = len(order)
        direct = (
            len(keys) == 1 and not zero and lengths[0] == n and all(e[1] == j for j, e in entries.items())
        )
        index = None
        if keys and not direct:
            offsets = dict(zip(keys, np.cumsum((0, *lengths[:-1])).tolist(), strict=True))
            zero_at = sum(lengths)  # the zero row, after the outputs
            picks = {j: zero_at if e is None else offsets[e[0]] + e[1] for j, e in entries.items()}
            first = next(iter(picks.values()))  # padding reads some real row: its results are dropped
            index = mx.array(np.array([picks.get(j, first) for j in range(n)], dtype=np.int32))
        # an output a failed pass never wrote reads as zero (its rows end with that step's error)
        sources = [[layer.outputs.get(k) or [None] * layer.size for k in keys] for layer in self.layers]
        key = self._new_key(n)
        for j in entries:
            self._move(order[j], (key, j))
        self._last = (slots.tobytes(), key, self._users[key])
        return PassRead(key, n, keys, lengths, index, zero, fresh=not keys), sources

    def _same_as_last(self, slots: np.ndarray) -> tuple[PassRead, list[list[Snapshot]]] | None:
        """The steady decode step: the last pass's slots again, every row still lying in its output.
        The pass reads that output as it is and its new state takes the output's key (no row moves:
        O(layers), not O(rows), of Python a step)."""
        last = self._last
        if last is None or last[0] != slots.tobytes() or self._users.get(last[1]) != last[2]:
            return None
        key, n = last[1], len(slots)
        sources = []
        for layer in self.layers:
            held = layer.outputs.get(key) or [None] * layer.size
            sources.append([held])
            layer.outputs[key] = list(held)  # the pass's writes replace these, not what it reads
        return PassRead(key, n, (key,), (n,), None, zero=False, fresh=False), sources

    def _new_key(self, length: int) -> int:
        self._next += 1
        self._users[self._next] = 0
        self._length[self._next] = length
        return self._next

    def _move(self, slot: int, place: tuple[int, int] | None) -> None:
        old = self._where.pop(slot, None)
        if place is not None:
            self._where[slot] = place
            self._users[place[0]] += 1
        if old is not None:
            self._users[old[0]] -= 1
            if not self._users[old[0]]:
                # no row's state lies there now; a pass still reading or writing it holds its buffers
                self._drop(old[0])

    def _drop(self, key: int) -> None:
        self._users.pop(key, None)
        self._length.pop(key, None)
        for layer in self.layers:
            layer.outputs.pop(key, None)


class StateSlots:
    """One recurrent layer's state arrays: each output of a pass that ran it and still holds a row's
    state (or a restored snapshot), by key."""

    def __init__(self, ledger: StateLedger, size: int) -> None:
        self.ledger = ledger
        self.size = size
        self.outputs: dict[int, Snapshot] = {}
        self.like: list[Like | None] = [None] * size  # learnt from the first write of each array
        ledger.add(self)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.live())

    def live(self) -> list[mx.array]:
        return [a for arrays in self.outputs.values() for a in arrays if a is not None]

    def snapshot(self, row: int) -> Snapshot:
        """A copy of the row's state (independent of later passes)."""
        place = self.ledger.location(row)
        if place is None:
            return [None] * self.size  # restored as zero
        key, entry = place
        # `* 1` makes a new buffer, evaluated now: a view, or a lazy copy, would keep the pass's whole
        # [rows, ...] output alive for as long as the pool keeps the snapshot
        snap = [None if a is None else a[entry : entry + 1] * 1 for a in self.outputs[key]]
        mx.async_eval([a for a in snap if a is not None])
        return snap


def reset_row(layers: list[StateSlots], slot: int) -> None:
    """`slot`'s state starts at zero; the output that held it is freed once no row's state lies there."""
    if layers:
        layers[0].ledger.reset(slot)


def restore_row(layers: list[StateSlots], slot: int, states: list[Snapshot]) -> None:
    """`slot` starts from `states` (one snapshot per recurrent layer, in the model's order)."""
    if layers:
        layers[0].ledger.restore(slot, states)


class StateView:
    """An ArraysCache look-alike over one pass's rows for one layer.

    lengths: in a right-padded pass, each entry's real positions (the rest are padding); None: all real.
    """

    def __init__(
        self,
        slots: StateSlots,
        read: PassRead,
        sources: list[Snapshot],
        lengths: mx.array | None = None,
        mask: mx.array | None = None,
    ) -> None:
        """`sources`: the layer's arrays of `read.keys`; `mask`: `padding_mask(lengths, n)` of the
        pass, built once for all its recurrent layers."""
        self.slots = slots
        self._pass = read
        self._sources = sources
        self._mask = mask
        self._read: dict[int, mx.array | None] = {}
        # ArraysCache's fields, which mlx-lm's recurrent layers consult: with `lengths` they take each
        # row's convolution window at its own end and, through make_mask, keep its state unchanged
        # over the padding (the masked recurrence: gated_delta.py)
        self.left_padding = None
        self.lengths = lengths

    def __getitem__(self, index: int) -> mx.array | None:
        if index not in self._read:
            self._read[index] = self._gather(index)
        return self._read[index]

    def _gather(self, index: int) -> mx.array | None:
        read, like = self._pass, self.slots.like[index]
        if like is None:
            return None  # never written: the layer starts from zero itself, as in mlx-lm
        shape, dtype = like
        if read.fresh:
            return mx.zeros((read.rows, *shape), dtype=dtype)
        parts = [
            mx.zeros((length, *shape), dtype=dtype) if arrays[index] is None else arrays[index]
            for arrays, length in zip(self._sources, read.lengths, strict=True)
        ]
        if read.index is None:
            return parts[0]
        if read.zero:
            parts.append(mx.zeros((1, *shape), dtype=dtype))
        whole = parts[0] if len(parts) == 1 else mx.concatenate(parts)
        return whole[read.index]

    def __setitem__(self, index: int, value: mx.array) -> None:
        self._read[index] = value
        slots = self.slots
        if slots.like[index] is None:
            slots.like[index] = (tuple(value.shape[1:]), value.dtype)
        if slots.ledger.holds(self._pass.key):  # else every row of the pass has ended already
            slots.outputs.setdefault(self._pass.key, [None] * slots.size)[index] = value

    @property
    def cache(self) -> list[mx.array | None]:
        return [self[i] for i in range(self.slots.size)]

    @property
    def state(self) -> list[mx.array | None]:
        return self.cache

    def advance(self, n: int) -> None:
        pass

    def make_mask(self, n: int) -> mx.array | None:
        """[rows, n] True at real positions (ArraysCache's); None when every position is real."""
        if self.lengths is None:
            return None
        if self._mask is not None and self._mask.shape[1] == n:
            return self._mask
        return padding_mask(self.lengths, n)

    def empty(self) -> bool:
        return self[0] is None

    def is_trimmable(self) -> bool:
        return False

    @property
    def nbytes(self) -> int:
        return self.slots.nbytes


def padding_mask(lengths: mx.array, n: int) -> mx.array:
    """[rows, n] True at each row's first `lengths[row]` positions (the real ones of a right-padded pass)."""
    return mx.arange(n)[None, :] < lengths[:, None]
