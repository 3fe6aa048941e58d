"""A row's KV blocks and the prefix pool, for the MLX engine (a mixin of `MlxEngine`, kept apart so
the step loop reads on its own).

Uses the engine's `_alloc` (BlockAllocator), `_paged` (paged attention layers), `_layers` (with the
recurrent `StateSlots`), `_pool` (PrefixPool or None), `_batch` (StepBatch tables), `_counts`, `plan` and
`info`; releasing a row also frees its slot (`_slots`, `_rows`) and any choices it had not
forked yet (`_held`, `_finished_early`). Forking a job's other choices (`_fork`) takes a free slot
per choice (`_order`, `_tokenizer`, `_grammar_vocab`, `_init_history`). Whole blocks are shared by
reference (the allocator counts holders); a part-filled last block is copied, because the row writes
into it. The copies wait in `_copies` (both blocks held) and are made together, once per step, before
its passes (`_flush_copies`): each batch of copies waits for the device once. Checkpoints are pooled
once their pass is launched (`_save_checkpoints`), and the warm-up borrows blocks for the scratch slot
(`_scratch_pass`: also the engine's `_views`, `forward`, `_cache_arrays`).
"""

from __future__ import annotations

from dataclasses import replace

import mlx.core as mx
import numpy as np

from kinfer.engines.base import JobUpdate, choice_sampling
from kinfer.engines.mlx.kv import BLOCK, copy_blocks
from kinfer.engines.mlx.rows import PrefillPass, Row
from kinfer.engines.mlx.sampling import PENALTY_WINDOW_MAX, history_row, needs_penalties
from kinfer.engines.mlx.state import StateSlots, reset_row, restore_row
from kinfer.engines.mlx.warm_up import ScratchPass
from kinfer.errors import EngineFailure


class RowBlocks:
    """Block bookkeeping for rows: adopt a pool entry, share a sibling's prompt (fork a job's choices),
    grow, save, release."""

    def _release(self, row: Row, *, save: bool) -> None:
        if row.unborn:  # ended before its prompt was in: the other choices end with it, unborn
            self._held -= row.unborn
            self._finished_early.extend(
                JobUpdate(row.job.job_id, finish="cancelled", choice=c) for c in range(1, row.unborn + 1)
            )
            row.unborn = 0
        row.done = True
        if save and self._pool is not None and row.fed >= 1:
            self._save(row, row.fed)
        # a finished row's state would keep its last pass's whole output alive (state.py)
        reset_row([layer for layer in self._layers if isinstance(layer, StateSlots)], row.slot)
        self._alloc.release(row.blocks)
        row.blocks = []
        self._batch.clear_table(row.slot)
        self._slots[row.slot] = None
        del self._rows[row.key]
        self._batch.changed()

    def _save(self, row: Row, length: int) -> None:
        states = [layer.snapshot(row.slot) for layer in self._layers if isinstance(layer, StateSlots)]
        self._pool.save(tuple(row.tokens[:length]), row.blocks, states if self.info.recurrent else None)

    def _adopt(self, row: Row) -> None:
        found = self._pool.lookup(row.job.prompt)
        if found is None:
            return
        entry, shared = found
        self._share(row, entry.blocks, shared, shared)
        if entry.states is not None:
            recurrent = [layer for layer in self._layers if isinstance(layer, StateSlots)]
            restore_row(recurrent, row.slot, entry.states)
        self._counts["reused"] += shared

    def _share(self, row: Row, blocks: list[int], shared: int, reused: int) -> None:
        """Start `row` with the first `shared` tokens' KV of `blocks` (a pool entry's, or a sibling
        choice's): whole blocks are shared, a part-filled last one is copied (the row writes into it)."""
        whole, part = divmod(shared, BLOCK)
        row.blocks = list(blocks[:whole])
        self._alloc.hold(row.blocks)
        if part:
            (block,) = self._take_blocks(1)
            source = blocks[whole]
            # a block still waiting for its own copy (a choice forking off an adopted prompt) holds
            # nothing yet: copy from where it will come from (no pass runs between, so they are equal)
            source = next((src for src, dst in self._copies if dst == source), source)
            self._alloc.hold([source, block])  # until the copy is made, whatever ends first
            self._copies.append((source, block))
            row.blocks.append(block)
        row.fed = shared
        row.reused = reused
        self._batch.set_table(row.slot, row.blocks)
        self._batch.set_position(row.slot, shared)

    def _flush_copies(self) -> None:
        """Make the block copies rows asked for since the last step (before any pass reads them)."""
        if self._copies:
            pairs, self._copies = self._copies, []
            copy_blocks(self._paged, pairs)
            self._alloc.release([block for pair in pairs for block in pair])

    def _ensure_blocks(self, row: Row, tokens: int) -> None:
        need = (tokens + BLOCK - 1) // BLOCK - len(row.blocks)
        if need > 0:
            row.blocks.extend(self._take_blocks(need))
            self._batch.set_table(row.slot, row.blocks)

    def _take_blocks(self, n: int) -> list[int]:
        alloc = self._alloc
        if alloc.free < n and alloc.total < self.plan.max_blocks:
            self._grow(min(self.plan.max_blocks - alloc.total, max(n - alloc.free, alloc.total // 2)))
        while alloc.free < n and self._pool is not None and self._pool.evict_one():
            pass
        if alloc.free < n:
            raise EngineFailure(f"out of KV blocks ({alloc.total} in use); lower rows or ctx")
        return alloc.take(n)

    def _grow(self, blocks: int) -> None:
        """Add `blocks` KV blocks to every paged layer, one layer at a time, each grown pool evaluated
        at once. Grown lazily, every layer's old and new pools would be alive together until the pass
        that first uses them ends (on a GPU MLX frees a pass's buffers only then), ~2.5x the KV at that
        peak; and the growth's copies, inside that pass, made it a graph no warm-up had run: on an H100
        the step after a 50,000-token prompt's row left re-instantiated every CUDA graph of the pass,
        35-47 ms against 7-15 (docs/benchmarks.md, "H100, second session of 2026-12-06")."""
        self._alloc.add(blocks)
        for layer in self._paged:
            layer.resize(self._alloc.total)
            mx.eval(layer.arrays())

    def _save_checkpoints(self, prefill: PrefillPass) -> None:
        """Pool the rows of a launched pass that reached a checkpoint. After the launch, not while the
        pass is built: a snapshot is evaluated at once (state.py), and it would otherwise evaluate the
        pass's recurrent layers itself, outside `_launch` (their buffers missing from the account's
        scratch, the pass cut into graphs the warm-up never made)."""
        if self._pool is None:
            return
        for row in prefill.rows:
            if row.fed in row.checkpoints:
                self._save(row, row.fed)

    def _scratch_pass(self) -> ScratchPass:
        """Passes on the scratch slot (warm_up.py), with KV blocks taken for a pass and given back."""
        scratch = self.plan.rows
        own = [int(self._batch.table(np.array([scratch]))[0, 0])]  # its one block
        taken: list[int] = []

        def table(tokens: int) -> np.ndarray:
            taken.extend(self._take_blocks((tokens + BLOCK - 1) // BLOCK - len(own)))
            self._batch.set_table(scratch, own + taken)
            return self._batch.table(np.array([scratch]))[0]

        def release() -> None:
            self._alloc.release(taken)
            taken.clear()
            self._batch.clear_table(scratch)
            self._batch.set_table(scratch, own)

        return ScratchPass(
            scratch, table, release, self._views, self.forward, self._cache_arrays, self._in_parts
        )

    def _fork(self, parent: Row) -> None:
        """The job's other choices, once all of its prompt but the last token is in `parent`: each
        takes a free slot sharing the parent's KV blocks (its own copy of a part-filled last one) and
        recurrent state, then feeds the last prompt token in the same decode pass as the parent."""
        job = parent.job
        recurrent = [layer for layer in self._layers if isinstance(layer, StateSlots)]
        states = [layer.snapshot(parent.slot) for layer in recurrent]
        for choice in range(1, parent.unborn + 1):
            slot = self._slots.index(None)
            self._order += 1
            own = replace(job, sampling=choice_sampling(job.sampling, choice))
            row = Row(slot, own, self._order, self.plan.ctx, self._tokenizer.piece, choice)
            if job.constraint is not None:
                row.grammar = self._grammar_vocab().start(job.constraint)
            self._slots[slot] = row
            self._rows[row.key] = row
            self._share(row, parent.blocks, parent.fed, parent.reused)
            restore_row(recurrent, slot, states)
            if needs_penalties(own.sampling):
                self._init_history(row)
        self._held -= parent.unborn
        parent.unborn = 0
        self._batch.changed()

    def _init_history(self, row: Row) -> None:
        if self._history is None:
            self._history = mx.full((self.plan.rows, PENALTY_WINDOW_MAX), -1, dtype=mx.int32)
        self._history[row.slot] = history_row(row.job.prompt)
