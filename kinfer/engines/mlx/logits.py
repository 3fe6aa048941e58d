"""A decode batch's logits between the forward pass and the draw, for the rows that ask: logit_bias
(one dense [B, V] table per batch shape, zeros for rows without), grammar masks, and the logprobs
read back beside the tokens. A batch where no row asks runs none of this."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import mlx.core as mx
import numpy as np

from kinfer.constrain.runtime import MaskTable, RowGrammar
from kinfer.engines.logprobs import bias_arrays, record
from kinfer.protocol import Sampling, TokenLogprob


class MaskedRow(Protocol):
    """What masking reads of a row (rows.Row)."""

    slot: int
    grammar: RowGrammar | None
    done: bool


R = TypeVar("R", bound=MaskedRow)


def with_bias(logits: mx.array, bias: mx.array) -> mx.array:
    """The logits with a bias table added, in float32 (a bias may be as small as a bf16 step)."""
    return logits.astype(mx.float32) + bias


def bias_table(samplings: Sequence[Sampling], vocab: int) -> mx.array | None:
    """[B, V] float32 biases, or None when no row has a logit_bias."""
    if not any(s.logit_bias for s in samplings):
        return None
    table = np.zeros((len(samplings), vocab), dtype=np.float32)
    for i, sampling in enumerate(samplings):
        if (arrays := bias_arrays(sampling)) is not None:
            table[i, arrays[0]] = arrays[1]
    return mx.array(table)


@dataclass(frozen=True)
class LogprobRows:
    """Which entries of a decode batch report logprobs (`positions`), with how many alternatives each
    (`counts`); the device computes `top` = the most any of them asks."""

    positions: tuple[int, ...]
    counts: tuple[int, ...]
    index: mx.array  # positions as a device array
    top: int

    @staticmethod
    def of(samplings: Sequence[Sampling]) -> LogprobRows | None:
        wanted = [(i, s.logprobs) for i, s in enumerate(samplings) if s.logprobs is not None]
        if not wanted:
            return None
        positions, counts = zip(*wanted, strict=True)
        return LogprobRows(positions, counts, mx.array(np.asarray(positions, np.int32)), max(counts))

    def compute(self, logits: mx.array, tokens: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """(chosen token's logprob [R], top ids [R, top], top logprobs [R, top]) on the device: the
        log-softmax of the logits the rows sampled from, after bias and mask, before penalties and
        temperature."""
        rows = logits[self.index].astype(mx.float32)
        logprobs = rows - mx.logsumexp(rows, axis=-1, keepdims=True)
        chosen = mx.take_along_axis(logprobs, tokens[self.index][:, None], axis=-1)[:, 0]
        if self.top == 0:
            empty = mx.zeros((len(self.positions), 0))
            return chosen, empty.astype(mx.int32), empty
        part = mx.argpartition(-logprobs, self.top - 1, axis=-1)[:, : self.top]
        values = mx.take_along_axis(logprobs, part, axis=-1)
        order = mx.argsort(-values, axis=-1)
        return chosen, mx.take_along_axis(part, order, axis=-1), mx.take_along_axis(values, order, axis=-1)

    def records(
        self, arrays: tuple[mx.array, mx.array, mx.array], tokens: list[int], piece: Callable[[int], bytes]
    ) -> dict[int, TokenLogprob]:
        """The read-back arrays as one record per batch position."""
        chosen, ids, values = (a.tolist() for a in arrays)
        out = {}
        for j, (position, count) in enumerate(zip(self.positions, self.counts, strict=True)):
            top_ids, top_values = ids[j][:count], values[j][:count]
            out[position] = record(piece, tokens[position], chosen[j], top_ids, top_values)
        return out


def grammar_words(masks: MaskTable, rows: Sequence[R]) -> tuple[np.ndarray | None, list[R]]:
    """The batch's mask words ([B, W], all ones for free rows) and the rows whose grammar dead-ended
    (their token is dropped); None when no row needs a mask now."""
    masked = [
        (i, row)
        for i, row in enumerate(rows)
        if row.grammar is not None and not row.done and (row.grammar.active or row.grammar.blocks_eos)
    ]
    if not masked:
        return None, []
    masks.fill([(row.slot, row.grammar) for _, row in masked])
    words = np.full((len(rows), masks.words.shape[1]), -1, dtype=np.int32)
    dead = []
    for i, row in masked:
        if masks.dead_end(row.slot, row.grammar):
            dead.append(row)
        else:
            words[i] = masks.words[row.slot]
    return words, dead
