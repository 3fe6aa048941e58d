"""Recurrent state (GatedDeltaNet, Mamba, conv caches) of every row, one slot per row.

mlx-lm's recurrent layers keep their state in an `ArraysCache` whose arrays have the batch on axis 0.
Here each such array holds every row's slot ([rows, ...]); a `StateView` stands in for the
ArraysCache during one forward pass: it hands the layer the rows of that pass and writes the new
state back into their slots. Unlike attention KV, this state cannot be trimmed to a shorter prefix,
so the prefix pool keeps exact snapshots (`snapshot` / `restore`).
"""

from __future__ import annotations

import mlx.core as mx

Snapshot = list[mx.array | None]


class StateSlots:
    """The state arrays of one recurrent layer for all rows (None until the model first writes one)."""

    def __init__(self, rows: int, size: int) -> None:
        self.rows = rows
        self.arrays: list[mx.array | None] = [None] * size

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays if a is not None)

    def live(self) -> list[mx.array]:
        return [a for a in self.arrays if a is not None]

    def reset(self, row: int) -> None:
        """A new reply takes the row: its state starts at zero."""
        for i, a in enumerate(self.arrays):
            if a is not None:
                a[row] = mx.zeros(a.shape[1:], dtype=a.dtype)
                self.arrays[i] = a

    def snapshot(self, row: int) -> Snapshot:
        """A copy of the row's state (independent of later updates to the slot)."""
        # `* 1` makes a new buffer: a view would pin the slot array and defeat in-place updates. It is
        # evaluated now: left lazy, the copy's graph would keep this step's whole [rows, ...] slot array
        # alive for as long as the pool keeps the snapshot (64 rows of a 0.8B hybrid model: GiBs each)
        snap = [None if a is None else a[row : row + 1] * 1 for a in self.arrays]
        mx.async_eval([a for a in snap if a is not None])
        return snap

    def restore(self, row: int, snap: Snapshot) -> None:
        for i, saved in enumerate(snap):
            a = self.arrays[i]
            if saved is None:
                if a is not None:
                    a[row] = mx.zeros(a.shape[1:], dtype=a.dtype)
                continue
            if a is None:
                a = mx.zeros((self.rows, *saved.shape[1:]), dtype=saved.dtype)
            a[row] = saved[0]
            self.arrays[i] = a


class StateView:
    """An ArraysCache look-alike over some rows' slots for one forward pass.

    rows: slot index of each batch entry; None means every slot in order (no gather, no scatter).
    lengths: in a right-padded pass, each entry's real positions (the rest are padding); None: all real.
    """

    def __init__(
        self,
        slots: StateSlots,
        rows: mx.array | None,
        lengths: mx.array | None = None,
        mask: mx.array | None = None,
    ) -> None:
        """`mask`: `padding_mask(lengths, n)` of the pass, built once for all its recurrent layers."""
        self.slots = slots
        self.rows = rows
        self._mask = mask
        self._read: dict[int, mx.array | None] = {}
        # ArraysCache's fields, which mlx-lm's recurrent layers consult: with `lengths` they take each
        # row's convolution window at its own end and, through make_mask, keep its state unchanged
        # over the padding (the masked recurrence: gated_delta.py)
        self.left_padding = None
        self.lengths = lengths

    def __getitem__(self, index: int) -> mx.array | None:
        if index not in self._read:
            a = self.slots.arrays[index]
            self._read[index] = a if a is None or self.rows is None else a[self.rows]
        return self._read[index]

    def __setitem__(self, index: int, value: mx.array) -> None:
        self._read[index] = value
        slots = self.slots
        a = slots.arrays[index]
        if self.rows is None:
            slots.arrays[index] = value
            return
        if a is None:
            a = mx.zeros((slots.rows, *value.shape[1:]), dtype=value.dtype)
        a[self.rows] = value.astype(a.dtype)
        slots.arrays[index] = a

    @property
    def cache(self) -> list[mx.array | None]:
        return [self[i] for i in range(len(self.slots.arrays))]

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
        return self.slots.arrays[0] is None

    def is_trimmable(self) -> bool:
        return False

    @property
    def nbytes(self) -> int:
        return self.slots.nbytes


def padding_mask(lengths: mx.array, n: int) -> mx.array:
    """[rows, n] True at each row's first `lengths[row]` positions (the real ones of a right-padded pass)."""
    return mx.arange(n)[None, :] < lengths[:, None]
