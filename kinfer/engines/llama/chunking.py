"""Where a step's prompt chunk ends in the llama.cpp engine.

No prompt token is ever evaluated alone in a micro-batch (a lone token takes another attention
kernel, so a cold run, a chunked run and a run adopted from the pool would differ): a chunk never
leaves exactly one token behind, and never splits into micro-batches with a lone one at the end.
With exact checkpoints, a chunk also stops at the next checkpoint, because recurrent state can only
be saved as it stands after a decode. How many tokens the step may take at all is the caller's
(`budget`: the step's token cap, and the time budget of engines/prefill_budget.py).
"""

from __future__ import annotations

from collections.abc import Iterable


def chunk_end(length: int, start: int, budget: int, n_ubatch: int, checkpoints: Iterable[int] = ()) -> int:
    """The end of the chunk of a `length`-token prompt fed from `start` (== start: wait a step).

    `checkpoints`: prompt lengths to stop at (only where the pool saves exact checkpoints)."""
    limit = min(length, start + budget)
    checkpoint = min((c for c in checkpoints if start < c < limit), default=limit)
    limit, at_checkpoint = checkpoint, checkpoint < limit
    for end in range(limit, start + 1, -1):
        if length - end != 1 and (end - start) % n_ubatch != 1:
            return end
    # nothing pairs up: a lone token is all there is before the prompt's end or a checkpoint
    return limit if limit - start == 1 and (limit == length or at_checkpoint) else start
