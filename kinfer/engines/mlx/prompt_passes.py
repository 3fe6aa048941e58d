"""A step's prompt passes: each whole, or, beside decoding rows on CUDA, a few of the model's layers a
step (the layer split).

Beside decoding rows a prompt longer than the step's share (prefill_budget.UNTIMED_BESIDE_DECODE: 256
tokens) goes in one chunk a step (rows.plan_prefill), and each chunk's pass is a whole forward pass for
the host to build and encode (~10 ms for qwen3-0.6b's 28 layers on the H200), past a few thousand keys
with its attention over the whole context for the device too (~0.7 ms a layer at 30,000 keys). Such a
step took 14-33 ms against 5-8 ms for a decode step, so every streaming reply's gap grew 3-7x while the
prompt went in. Fewer tokens a chunk do not help: the host's part of a pass hardly depends on its
tokens (128-token chunks took as long a step as 256-token ones; docs/benchmarks.md, "H200, fifth
session of 2026-12-04"). Fewer layers do: both the host's part and the device's shrink with them.

So such a chunk runs through its layers in `parts(end, layers)` consecutive ranges, one range a step:
two, and one more for every KEYS_PER_PART keys it attends to (the device's share grows with them). A
prompt that goes in whole keeps one pass (its first token a step sooner). Between steps the pass waits
as its carry (compiled_step.CompiledDecoder.through: the residual stream into the next layer and that
layer's q, k, v; hybrid_layers.HybridLayers.through: the residual stream), evaluated with the step like
the caches; the row's position advances, its checkpoints are saved and its progress reported once the
last range has run. A row released mid-chunk (cancelled, failed) drops it: its blocks go back with it,
and no position was claimed. The warm-up runs each chunk shape in its parts (warm_up.py: each part's
graphs are its own).

On the H200 (qwen3-0.6b, 16 rows streaming beside a 30,357-token prompt, through HTTP): steps with a
chunk's part 11-15 ms against 20-33 ms for whole chunks, the rows' largest gap 36 ms against 49-66 ms,
the prompt's first token 4.2-4.4 s against 3.0-3.6 s (every step runs the decode pass too;
docs/benchmarks.md, "H200, sixth session of 2026-12-04").

Where the compiled decoder runs one row's prompt chunks (compiled_step.ARCHITECTURES with the shape
buckets on: an explicit loop over layers), and on Qwen3.5's hybrid layers through their own code
(hybrid_layers.py; a padded chunk too, its recurrence masked as whole). Not on a shard. The setting
`--mlx-layer-split off` (`KINFER_MLX_LAYER_SPLIT=off`) turns it off.

`PromptPasses` is the MLX engine's side (a mixin, as row_blocks.RowBlocks): a pass run whole, or a
split one started and carried on, and the rows' positions moved on once their chunks are in.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from kinfer.engines.base import JobUpdate
from kinfer.engines.mlx import shape_buckets
from kinfer.engines.mlx.compiled_step import CompiledDecoder
from kinfer.engines.mlx.gated_delta import kinfer_pass
from kinfer.engines.mlx.hybrid_layers import HybridLayers
from kinfer.engines.mlx.kv import PassLayout
from kinfer.engines.mlx.rows import PrefillPass
from kinfer.engines.mlx.shape_buckets import bucket

KEYS_PER_PART = 16384  # one more part for every this many keys (bucketed) the chunk attends to
LEAST_PARTS = 2  # a whole chunk's pass took ~2-3x a decode step at any context (host time alone)


def parts(end: int, layers: int) -> int:
    """How many steps a chunk ending at position `end` takes through a model of `layers` layers."""
    return max(1, min(layers, LEAST_PARTS + bucket(end) // KEYS_PER_PART))


def layer_ranges(layers: int, count: int) -> list[range]:
    """`layers` cut into `count` consecutive ranges of (nearly) equal size, the larger ones first."""
    size, extra = divmod(layers, count)
    ranges, start = [], 0
    for i in range(count):
        stop = start + size + (1 if i < extra else 0)
        ranges.append(range(start, stop))
        start = stop
    return ranges


@dataclass
class SplitChunk:
    """One row's chunk part-way through its layers: its pass, the views it writes through (the same
    layout every step: its block table and attention inputs were built once), the carry into the next
    range, and the ranges still to run."""

    prefill: PrefillPass
    views: list
    carry: tuple[mx.array, ...]  # compiled_step.Carry or hybrid_layers.Carry
    left: list[range]

    @property
    def rows(self) -> list:
        return self.prefill.rows


class PromptPasses:
    """The MLX engine's prompt passes (module doc): whole, or in parts of its layers."""

    @property
    def _layered(self) -> CompiledDecoder | HybridLayers | None:
        """What runs a chunk a few layers a step: the compiled decoder, else a hybrid model's own layers
        (None: neither; chunks go whole)."""
        return self._decoder or self._hybrid

    def _prefill(self, prefill: PrefillPass) -> int:
        """One pass over `prefill.rows`' next chunks (right-padded, see PrefillPass); returns the
        positions computed."""
        slots, tokens, chunks, layout = self._pass_inputs(prefill)
        lengths = self._padding(prefill, chunks)
        self.forward(mx.array(tokens), self._views(layout, slots, lengths))  # logits unused: never computed
        self._advance(prefill)
        return prefill.tokens

    def _pass_inputs(self, prefill: PrefillPass) -> tuple[np.ndarray, list[list[int]], list[int], PassLayout]:
        """The pass's KV blocks taken, its slots, tokens and chunks (rows padded to a bucket on CUDA)
        and its layout."""
        for row in prefill.rows:
            self._ensure_blocks(row, row.fed + prefill.length)
        rows = len(prefill.rows)
        slots, tokens, chunks = prefill.inputs(shape_buckets.row_bucket(rows) if self._pad_decode else rows)
        table, starts = self._batch.table(slots), self._batch.positions(slots)
        return slots, tokens, chunks, PassLayout(table, starts, prefill.length, decode=False)

    def _padding(self, prefill: PrefillPass, chunks: list[int]) -> mx.array | None:
        """Each row's real positions where a recurrent model's pass is right-padded: recurrent layers
        keep each row's state at its own end (StateView.lengths); attention needs no mask for the
        padding (see PrefillPass). None where every position is real."""
        return mx.array(chunks) if self.info.recurrent and min(chunks) < prefill.length else None

    def _advance(self, prefill: PrefillPass) -> None:
        """The pass's chunks are in: its rows' positions move past them."""
        for row, n in zip(prefill.rows, prefill.chunks, strict=True):
            row.fed += n
            self._batch.set_position(row.slot, row.fed)
            self._counts["prompt"] += n

    def _passed(self, prefill: PrefillPass, updates: list[JobUpdate]) -> None:
        """After a prefill pass's launch: checkpoints pooled, progress reported."""
        self._save_checkpoints(prefill)
        updates.extend(row.progress_update() for row in prefill.rows)

    # ---- the layer split -------------------------------------------------------------------

    def _parts(self, prefill: PrefillPass) -> int:
        """How many steps `prefill` (beside decoding rows) takes through the layers: 1 unless it is a
        chunk of one row's prompt that takes several (a prompt that goes in whole keeps one pass: its
        first token comes a step sooner)."""
        if len(prefill.rows) != 1:
            return 1
        row = prefill.rows[0]
        if row.fed == 0 and prefill.chunks[0] == row.next_chunk():
            return 1
        return self._split_parts(row.fed + prefill.length)

    def _split_parts(self, end: int) -> int:
        """The parts of one row's chunk ending at `end`: 1 where no layered pass runs one row's prompt
        chunks (shape_buckets.compiled_chunk, the compiled decoder's check), on a shard, or with the
        setting off."""
        layered = self._layered
        if not self._layer_split or layered is None or not layered.chunks:
            return 1
        return parts(end, len(self._layers)) if shape_buckets.compiled_chunk(1) else 1

    def _in_parts(self, inputs: mx.array, views: list, count: int) -> None:
        """A chunk's pass in `count` parts as serving runs them, each evaluated apart (the warm-up's)."""
        assert self._layered is not None
        with kinfer_pass(kernel=self._gated_delta, precompiled=self._precompiled):
            carry = self._layered.enter(inputs, views)
            for layers in layer_ranges(len(self._layers), count):
                out = self._layered.through(carry, views, layers)
                carry_arrays = list(out) if isinstance(out, tuple) else []
                mx.eval([*self._cache_arrays(), *carry_arrays])
                carry = out

    def _start_split(self, prefill: PrefillPass, count: int, updates: list[JobUpdate]) -> int:
        """Start `prefill` (one row's chunk) in `count` ranges of layers; runs the first."""
        slots, tokens, chunks, layout = self._pass_inputs(prefill)
        views = self._views(layout, slots, self._padding(prefill, chunks))
        assert self._layered is not None
        with kinfer_pass(kernel=self._gated_delta, precompiled=self._precompiled):
            carry = self._layered.enter(mx.array(tokens), views)
        ranges = layer_ranges(len(self._layers), count)
        self._split = SplitChunk(prefill, views, carry, ranges)
        self._step_prefill -= prefill.tokens  # this step runs one part of it (_split_part counts it)
        return self._split_part(updates, every=False)

    def _split_part(self, updates: list[JobUpdate], *, every: bool) -> int:
        """The pending chunk's next range of layers (every range left, where `every`), launched;
        returns the positions computed (the chunk's, counted by its last range)."""
        split = self._split
        assert split is not None and self._layered is not None
        while split.left:
            layers = split.left.pop(0)
            with kinfer_pass(kernel=self._gated_delta, precompiled=self._precompiled):
                out = self._layered.through(split.carry, split.views, layers)
            self._step_prefill += max(1, split.prefill.tokens * len(layers) // len(self._layers))
            if not split.left:  # the logits: unused, never computed
                self._launch(self._cache_arrays())
                self._split = None
                self._advance(split.prefill)
                self._passed(split.prefill, updates)
                return split.prefill.tokens
            assert isinstance(out, tuple)
            split.carry = out
            self._launch([*self._cache_arrays(), *out])
            if not every:
                break
        return 0
