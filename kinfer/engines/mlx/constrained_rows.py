"""Constrained rows (JSON Schema, regex, forced tools) in the MLX engine's decode step (a mixin of
`MlxEngine`, kept apart so the step loop reads on its own).

Uses the engine's `_grammar` / `_masks` (built with the first constrained job), `_tokenizer`, `_batch`,
`_eos`, `plan`, `step_timer`, `_inflight`, `_collect` and `_release`.
"""

from __future__ import annotations

import mlx.core as mx

from kinfer.constrain.runtime import GrammarVocab, MaskTable
from kinfer.engines.base import JobUpdate
from kinfer.engines.mlx.grammar import grammar_vocab
from kinfer.engines.mlx.logits import grammar_words
from kinfer.engines.mlx.rows import Row
from kinfer.engines.mlx.sampling import mask_logits


class ConstrainedRows:
    """The grammar vocabulary and the per-step masks of constrained rows."""

    def _grammar_vocab(self) -> GrammarVocab:
        if self._grammar is None:
            self._grammar = grammar_vocab(self._tokenizer, self._batch.vocab, self._eos)
            self._masks = MaskTable(self.plan.rows, self._grammar)
        return self._grammar

    def _constrain(self, logits: mx.array, rows: list[Row], updates: list[JobUpdate]) -> mx.array:
        """Mask the constrained rows' logits. Their grammars need the previous step's tokens, so that
        step is read back first, while the device runs this step's forward pass, and the masks are
        computed meanwhile too. A row ended by that read (or by a dead end) keeps its place in the
        batch; its token is dropped."""
        if self._inflight is not None:
            self.step_timer.lap("build")
            mx.async_eval(logits)
            self.step_timer.lap("launch")
            updates.extend(self._collect(self._inflight))
            self._inflight = None
        assert self._masks is not None
        words, dead = grammar_words(self._masks, rows)
        for row in dead:
            updates.append(row.dead_end())
            self._release(row, save=False)
        return logits if words is None else mask_logits(logits, mx.array(words))
