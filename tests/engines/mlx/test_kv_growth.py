"""The KV pools grow apart from the passes (row_blocks.RowBlocks._grow): a pool grown inside a pass
keeps the old and the new pool alive until the pass ends, and on CUDA makes the pass a new graph
topology (every CUDA graph of it instantiated again: the H100's 36-46 ms step after a long prompt's
row left, docs/benchmarks.md)."""

from __future__ import annotations

from kinfer.engines.mlx.graph_ops import kernel_sequence
from kinfer.engines.mlx.kv import BLOCK
from tests.engines.mlx.fixtures import *  # noqa: F403
from tests.engines.mlx.fixtures import job, launches_recorded


def test_grown_pools_are_evaluated_before_any_pass_reads_them(tiny_qwen3, make_mlx):
    engine = make_mlx(tiny_qwen3, rows=1, ctx=1024, warm_up=False)
    total = engine._alloc.total
    engine._grow(4)
    assert engine._alloc.total == total + 4
    pools = [a for layer in engine._paged for a in layer.arrays()]
    assert pools and all(
        a.shape[0] == (total + 4) * layer.heads * BLOCK for layer in engine._paged for a in layer.arrays()
    )
    assert kernel_sequence(pools) == ()  # nothing left for the next pass to compute


def test_the_pass_of_the_step_that_grew_the_pools_is_the_pass_after_it(tiny_qwen3, make_mlx):
    engine = make_mlx(tiny_qwen3, rows=1, ctx=1024, warm_up=False)
    first = engine._alloc.total
    launched = launches_recorded(engine)
    engine.submit(job("long", [5, 6, 7, 8], max_tokens=first * BLOCK + 40, ignore_eos=True))
    passes = []  # (blocks before the step, blocks after it, the kernels of its pass)
    while engine.has_work:
        blocks, done = engine._alloc.total, len(launched)
        engine.step()
        passes += [(blocks, engine._alloc.total, kernels) for _, kernels in launched[done:]]
    grew = [i for i, (before, after, _) in enumerate(passes) if after > before]
    assert len(grew) == 1 and 1 < grew[0] < len(passes) - 1  # the row outgrew its first blocks decoding
    # no pool copied inside the pass (against the next step's: a longer row may change the split of
    # the decode attention at a block boundary, here that of the block that needed the growth)
    assert passes[grew[0]][2] == passes[grew[0] + 1][2]
