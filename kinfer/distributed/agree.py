"""Every rank takes rank 0's sampled tokens, inside the step's graph.

Each rank samples from its own copy of the logits. Those should be identical (the model's all-reduces
give every rank the same activations), but an all-reduce over more than two ranks need not add in the
same order everywhere, and a row whose token differed on one rank would drift: a different length, a
different stop, then a step whose passes no longer line up. So the tokens rank 0 drew are summed with
zeros from the others (integers: exact) and every rank feeds and reads back those. The sum is part of
the lazy graph, so it costs one small collective per decode pass and no host round trip.

Collectives must run in the same order on every rank, and MLX does not promise an order between
independent branches of one graph (two passes of a step, each with its own chain of all-reduces), nor
between a graph still running and a later one: a rank 0 that ran them in another order than rank 1
hung, each waiting for the other's bytes (seen on the CPU with a decode pass beside a prefill chunk).
So on a sharded engine each forward pass is evaluated before the next is built (`MlxEngine.forward`),
and the plan broadcast waits for the device first (plan.py). The price: a sharded step does not overlap
its host work with the device's.
"""

from __future__ import annotations

import mlx.core as mx


def agree_tokens(group: mx.distributed.Group):
    """tokens -> rank 0's tokens, on every rank of `group`."""
    mine = group.rank() == 0

    def agree(tokens: mx.array) -> mx.array:
        own = tokens if mine else mx.zeros_like(tokens)
        return mx.distributed.all_sum(own, group=group).astype(tokens.dtype)

    return agree
