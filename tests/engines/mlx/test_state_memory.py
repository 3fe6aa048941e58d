"""Recurrent-state snapshots hold only their row: the prefix pool's memory is what it counts.

A snapshot is a one-row copy of a layer's [rows, ...] state slots. Left as a lazy MLX expression, the copy
keeps the whole slot array of the step it was taken in alive (its graph's input), so every pool entry
pinned a full batch of state: on the H200, 64 rows of a 0.8B hybrid model grew active memory by tens of
GiB that no account named. The slots are replaced every step, so each snapshot must own its own buffer.
"""

from __future__ import annotations

import gc

import mlx.core as mx

from kinfer.engines.mlx.state import StateSlots

ROWS = 64
ROW_FLOATS = 64 * 1024  # 256 KiB of float32 per row: the slot array is 16 MiB


def _active_after_collect() -> int:
    gc.collect()
    mx.synchronize()
    mx.clear_cache()
    return mx.get_active_memory()


def test_snapshots_do_not_pin_the_slot_arrays_of_past_steps():
    slots = StateSlots(ROWS, 1)
    slots.arrays[0] = mx.zeros((ROWS, ROW_FLOATS), dtype=mx.float32)
    mx.eval(slots.arrays[0])
    slot_bytes = slots.arrays[0].nbytes
    before = _active_after_collect()

    snapshots = []
    for step in range(8):
        snapshots.append(slots.snapshot(step))
        # the next step writes new state: a new slot array replaces the old one, as a forward pass does
        slots.arrays[0] = slots.arrays[0] + 1
        mx.eval(slots.arrays[0])

    grown = _active_after_collect() - before
    kept = sum(a.nbytes for snap in snapshots for a in snap if a is not None)
    assert kept == 8 * slot_bytes // ROWS
    # the eight one-row copies, not eight [rows, ...] slot arrays (8 x 16 MiB)
    assert grown < kept + slot_bytes // 2, f"snapshots pinned {grown / 2**20:.0f} MiB for {kept / 2**20:.0f}"


def test_a_snapshot_keeps_its_values_when_the_slot_changes():
    slots = StateSlots(4, 1)
    slots.arrays[0] = mx.arange(8, dtype=mx.float32).reshape(4, 2)
    snap = slots.snapshot(2)
    slots.arrays[0] = slots.arrays[0] * 0
    assert snap[0].tolist() == [[4.0, 5.0]]
