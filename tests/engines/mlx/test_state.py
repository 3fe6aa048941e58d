"""Recurrent state lies where the last pass that ran a row left it: passes never copy other rows' state.

Each pass hands a recurrent layer its rows' state (`StateView`) and keeps the new state the layer returns
as is. A decode pass over the last pass's rows reads that output without a copy; a changed batch gathers
only its own rows; a snapshot owns its buffer. When every pass scattered its rows into one [slots, ...]
array, the gather that read the rows held that array, MLX could not update it in place, and every pass
copied all of it: on the H200, GBs a step and as much memory again for a 0.8B hybrid model.
"""

from __future__ import annotations

import gc

import mlx.core as mx
import numpy as np

from kinfer.engines.mlx.state import StateLedger, StateSlots, StateView, reset_row, restore_row

ROW_FLOATS = 64 * 1024  # 256 KiB of float32 per row


def _layer(scratch: int | None = None) -> StateSlots:
    ledger = StateLedger()
    ledger.scratch = scratch
    return StateSlots(ledger, size=1)


def _view(layer: StateSlots, slots: list[int]) -> StateView:
    read, sources = layer.ledger.begin(np.array(slots))
    return StateView(layer, read, sources[0])


def _run(layer: StateSlots, slots: list[int], step=lambda old: old + 1) -> mx.array:
    """One pass over `slots`: the layer reads its rows' state and writes `step` of it (zeros at first)."""
    view = _view(layer, slots)
    old = view[0]
    new = step(mx.zeros((len(slots), 2)) if old is None else old)
    view[0] = new
    mx.eval(new)
    return new


def _active_after_collect() -> int:
    gc.collect()
    mx.synchronize()
    mx.clear_cache()
    return mx.get_active_memory()


def test_a_pass_over_the_last_pass_rows_reads_its_output_as_it_is():
    layer = _layer()
    written = _run(layer, [0, 1, 2])
    assert _view(layer, [0, 1, 2])[0] is written  # no gather, no copy


def test_the_steady_step_keeps_the_output_key_and_reads_the_last_writes():
    layer = _layer(scratch=9)
    _run(layer, [0, 1, 9], lambda _: mx.array([[0.0, 0.0], [1.0, 1.0], [9.0, 9.0]]))
    key = layer.ledger.location(1)[0]
    for _ in range(3):
        _run(layer, [0, 1, 9])
        assert layer.ledger.location(1) == (key, 1) and list(layer.outputs) == [key]
    assert _view(layer, [0, 1, 9])[0][:2].tolist() == [[3.0, 3.0], [4.0, 4.0]]
    reset_row([layer], 0)  # a row left: the next pass over the same slots gathers, row 0 from zero
    read = _view(layer, [0, 1, 9])
    assert read._pass.index is not None and read[0][:2].tolist() == [[0.0, 0.0], [4.0, 4.0]]


def test_a_changed_batch_reads_each_row_where_it_lies():
    layer = _layer(scratch=9)
    _run(layer, [0, 1], lambda _: mx.array([[0.0, 0.5], [1.0, 1.5]]))
    _run(layer, [2], lambda _: mx.array([[2.0, 2.5]]))
    reset_row([layer], 0)  # a new reply takes slot 0: zero
    read = _view(layer, [1, 2, 0, 9])[0]  # the scratch slot pads: any row will do
    assert read[:3].tolist() == [[1.0, 1.5], [2.0, 2.5], [0.0, 0.0]]


def test_the_scratch_slot_state_is_never_kept():
    layer = _layer(scratch=9)
    _run(layer, [0, 9, 9])
    assert layer.ledger.location(9) is None
    assert layer.ledger.location(0) is not None


def test_passes_of_only_the_scratch_slot_run_it_as_a_row_so_the_next_one_gathers():
    """The warm-up's passes: each reads the last one's state with the gather serving's passes use."""
    layer = _layer(scratch=9)
    _run(layer, [9, 9, 9])
    assert _view(layer, [9, 9])._pass.index is not None  # a new row count: a gather
    assert _view(layer, [9, 9])._pass.index is None  # the same again: the steady step, read as is
    reset_row([layer], 9)
    assert layer.ledger.location(9) is None


def test_an_output_is_freed_once_no_row_state_lies_in_it():
    layer = _layer()
    _run(layer, [0, 1])
    _run(layer, [0])  # row 1 still lies in the first output
    assert len(layer.outputs) == 2
    _run(layer, [1])
    assert len(layer.outputs) == 2  # the first one is gone: rows 0 and 1 lie in the last two
    reset_row([layer], 0)
    reset_row([layer], 1)
    assert layer.outputs == {} and layer.nbytes == 0  # no reply running: no state held


def test_a_pass_over_a_few_rows_does_not_copy_the_other_rows_state():
    rows, few = 64, 4
    layer = _layer()
    _run(layer, list(range(rows)), lambda _: mx.zeros((rows, ROW_FLOATS)))
    all_rows = rows * ROW_FLOATS * 4
    grown = []
    for _ in range(6):
        before = _active_after_collect()
        mx.reset_peak_memory()
        _run(layer, list(range(few)))
        grown.append(mx.get_peak_memory() - before)
    # each pass holds its rows' old and new state, a few hundred KiB, never the 16 MiB of every row
    assert max(grown) < all_rows // 4, f"a pass over {few} rows grew {max(grown) / 2**20:.1f} MiB"


def test_snapshots_do_not_pin_the_outputs_of_past_passes():
    rows = 64
    layer = _layer()
    _run(layer, list(range(rows)), lambda _: mx.zeros((rows, ROW_FLOATS)))
    pass_bytes = rows * ROW_FLOATS * 4
    before = _active_after_collect()
    snapshots = []
    for step in range(8):
        snapshots.append(layer.snapshot(step))
        _run(layer, list(range(rows)))  # the next pass's output replaces this one
    grown = _active_after_collect() - before
    kept = sum(a.nbytes for snap in snapshots for a in snap if a is not None)
    assert kept == 8 * pass_bytes // rows
    # the eight one-row copies, not eight [rows, ...] outputs (8 x 16 MiB)
    assert grown < kept + pass_bytes // 2, f"snapshots pinned {grown / 2**20:.0f} MiB for {kept / 2**20:.0f}"


def test_a_restored_snapshot_keeps_its_values_when_the_row_runs_on():
    layer = _layer()
    _run(layer, [0, 1], lambda _: mx.array([[1.0, 2.0], [3.0, 4.0]]))
    snap = layer.snapshot(1)
    restore_row([layer], 5, [snap])
    _run(layer, [5])
    _run(layer, [1])
    assert snap[0].tolist() == [[3.0, 4.0]]
    assert _view(layer, [5, 1])[0].tolist() == [[4.0, 5.0], [4.0, 5.0]]


def test_a_snapshot_of_a_row_with_no_state_restores_as_zero():
    layer = _layer()
    _run(layer, [0], lambda _: mx.ones((1, 2)))
    restore_row([layer], 3, [layer.snapshot(7)])
    assert _view(layer, [3, 0])[0].tolist() == [[0.0, 0.0], [1.0, 1.0]]
