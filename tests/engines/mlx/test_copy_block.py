"""Copying a part-filled block (a prompt adopting a pooled prefix, or n choices forking) must not copy
the whole KV pool: a pool slice assigned back into the same pool shares its buffer, and MLX would then
rewrite every layer's entire pool for one block (kv.copy_blocks)."""

from __future__ import annotations

import mlx.core as mx

from kinfer.engines.mlx.kv import BLOCK, PagedLayer, copy_blocks

HEADS, DIM, BLOCKS = 2, 64, 2048


def layer(seed: int) -> PagedLayer:
    made = PagedLayer()
    made.heads, made._blocks = HEADS, BLOCKS
    made.keys = mx.random.normal((BLOCKS * HEADS * BLOCK, DIM), key=mx.random.key(seed))
    made.values = made.keys + 1
    return made


def test_a_copied_block_lands_and_the_pools_are_updated_in_place():
    layers = [layer(0), layer(1)]
    mx.eval([a for item in layers for a in (item.keys, item.values)])
    size = HEADS * BLOCK
    source = [mx.array(item.keys[3 * size : 4 * size] * 1) for item in layers]
    mx.eval(source)
    mx.reset_peak_memory()
    before = mx.get_active_memory()
    copy_blocks(layers, [(3, 7)])
    mx.eval([a for item in layers for a in (item.keys, item.values)])
    for item, expected in zip(layers, source, strict=True):
        assert mx.array_equal(item.keys[7 * size : 8 * size], expected).item()
        assert mx.array_equal(item.values[7 * size : 8 * size], expected + 1).item()
    pool = layers[0].keys.nbytes  # 2 MiB x 4 pools here; a whole-pool copy would add at least one
    assert mx.get_peak_memory() - before < pool / 4


def test_a_steps_copies_land_together_each_from_its_own_source():
    layers = [layer(2), layer(3)]
    mx.eval([a for item in layers for a in (item.keys, item.values)])
    size = HEADS * BLOCK
    pairs = [(5, 9), (1, 4), (5, 11)]  # one source may feed two rows
    expected = [
        [mx.array(item.keys[src * size : (src + 1) * size] * 1) for src, _ in pairs] for item in layers
    ]
    others = [mx.array(item.keys[2 * size : 3 * size] * 1) for item in layers]
    copy_blocks(layers, pairs)
    for item, sources, other in zip(layers, expected, others, strict=True):
        for (_, dst), source in zip(pairs, sources, strict=True):
            assert mx.array_equal(item.keys[dst * size : (dst + 1) * size], source).item()
            assert mx.array_equal(item.values[dst * size : (dst + 1) * size], source + 1).item()
        assert mx.array_equal(item.keys[2 * size : 3 * size], other).item()  # a block nobody copied to
