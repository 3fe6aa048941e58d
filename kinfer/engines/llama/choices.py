"""n choices on the llama.cpp engine: each choice's sampler chain, its fork from the first choice's
sequence once the prompt is in, and the first draws that all come from the prompt's last logits."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kinfer.constrain.runtime import GrammarVocab
from kinfer.engines.base import GenerationJob, JobUpdate, choice_sampling
from kinfer.engines.llama import native, samplers
from kinfer.engines.llama.rows import Row, RowKey


def make_sampler(job: GenerationJob, choice: int, n_vocab: int, row_len: int) -> int:
    """Choice `choice`'s own sampler chain (seed + choice), warmed with the prompt's tail when it
    has penalties (they look back over the prompt too, as llama-server does)."""
    sampling = choice_sampling(job.sampling, choice)
    sampler = samplers.make_sampler(sampling, n_vocab, row_len)
    if samplers.has_penalties(sampling):
        window = samplers.penalty_window(sampling, row_len)
        for token in job.prompt[-window:]:
            samplers.sampler_accept(sampler, token)
    return sampler


def fork(
    mem: int, parent: Row, sampler: Callable[[GenerationJob, int], int], grammars: Callable[[], GrammarVocab]
) -> list[Row]:
    """The job's other choices, once its prompt is in `parent`'s sequence: each reserved sequence
    gets a copy of the prompt's KV (no recompute) and a sampler and grammar of its own."""
    job, siblings = parent.job, []
    for choice, seq in enumerate(parent.reserved, start=1):
        native.seq_copy(mem, parent.seq, seq)
        row = Row(seq, job, parent.order, sampler(job, choice), choice)
        row.tokens = list(parent.tokens)
        row.reused = parent.reused
        if job.constraint is not None:
            row.grammar = grammars().start(job.constraint)
        siblings.append(row)
    parent.reserved = []
    return siblings


def draw_each(
    ctx: int, n_vocab: int, rows: list[Row], index: int, sample: Callable[[Row, int], JobUpdate]
) -> list[tuple[RowKey, JobUpdate]]:
    """Every choice's first draw from the logits at batch `index`, each its own way. A draw writes its
    bias and mask into those logits, so each choice starts from a copy of them as the model gave them."""
    if len(rows) == 1:
        return [(rows[0].key, sample(rows[0], index))]
    logits = native.row_logits(ctx, index, n_vocab)
    raw = logits.copy()
    drawn = []
    for row in rows:
        np.copyto(logits, raw)
        drawn.append((row.key, sample(row, index)))
    return drawn
