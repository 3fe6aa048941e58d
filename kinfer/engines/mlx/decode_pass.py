"""The MLX engine's decode pass (a mixin, as prompt_passes.PromptPasses): every decoding row's next
token built on the device in one pass (`_decode`: logit bias, a grammar's mask, penalties, the draw,
logprobs for the rows that ask), and read back one step later (`_collect`: the host's only wait),
turned into the rows' updates."""

from __future__ import annotations

from dataclasses import replace

import mlx.core as mx
import numpy as np

from kinfer.engines.base import JobUpdate
from kinfer.engines.mlx.kv import PassLayout
from kinfer.engines.mlx.logits import with_bias
from kinfer.engines.mlx.rows import Inflight, Row
from kinfer.engines.mlx.sampling import push_history, sample


class DecodePass:
    """The MLX engine's decode pass and the reading of its tokens (module doc)."""

    def _decode(self, rows: list[Row], updates: list[JobUpdate]) -> Inflight:
        batch = self._batch
        plan = batch.plan(rows)
        for row in rows:
            self._ensure_blocks(row, row.fed + 1)
        layout = PassLayout(batch.table(plan.slots), batch.positions(plan.slots), 1, decode=True)
        inputs = batch.inputs(rows)
        if plan.padding:
            inputs = mx.concatenate([inputs.astype(mx.int32), mx.zeros((plan.padding,), dtype=mx.int32)])
        if self._pad_decode:  # CUDA: apart, so the pass's graphs start where the warm-up's did (_launch)
            mx.async_eval(inputs)
        logits = self.forward(inputs[:, None], self._views(layout, plan.slots))[:, -1, :]
        if plan.padding:
            logits = logits[: len(rows)]
        if plan.bias is not None:  # logit_bias first, then the grammar's mask: -inf stays -inf
            logits = with_bias(logits, plan.bias)
        if any(row.grammar is not None for row in rows):
            logits = self._constrain(logits, rows, updates)
        history = None
        if plan.sampling.penalties and self._history is not None:
            history = self._history if plan.history_rows is None else self._history[plan.history_rows]
        # the draw's random number comes from (seed, position): a row's draws ignore the rest of the batch
        starts = layout.starts[: len(rows)]
        counters = None if plan.sampling.all_greedy else mx.array(starts.astype(np.uint32))
        tokens = sample(logits, plan.sampling, counters, history)
        if self._agree is not None:
            tokens = self._agree(tokens)
        if history is not None:
            updated = push_history(history, tokens)
            if plan.history_rows is None:
                self._history = updated
            else:
                self._history[plan.history_rows] = updated
        # only rows that ask pay for a log-softmax (on the logits they sampled from)
        logprobs = plan.logprobs.compute(logits, tokens) if plan.logprobs is not None else None
        batch.dispatched(rows, tokens)
        return Inflight(tokens, rows, plan.logprobs, logprobs)

    def _collect(self, step: Inflight) -> list[JobUpdate]:
        """Read a dispatched step's tokens (the host's only wait) and turn them into updates."""
        self.step_timer.lap("other")
        values = step.tokens.tolist()
        self.step_timer.lap("wait")
        records = {}
        if step.logprob_rows is not None and step.logprobs is not None:
            records = step.logprob_rows.records(step.logprobs, values, self._tokenizer.piece)
        updates = []
        for i, (row, token) in enumerate(zip(step.rows, values, strict=True)):
            if row.done:
                continue  # finished or cancelled after this step was dispatched
            self._counts["generated"] += 1
            update = row.accept(token, self._eos)
            if i in records and not (token in self._eos and not row.job.ignore_eos):
                update = replace(update, logprobs=(records[i],))  # an end token has no text, no logprob
            updates.append(update)
            if update.finish is not None:
                self._release(row, save=True)
        return updates
