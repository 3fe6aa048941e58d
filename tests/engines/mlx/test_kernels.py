"""Decode attention over paged KV: the portable MLX-ops path and the fused CUDA kernel both agree with
plain dense attention over each row's own positions.

The CUDA tests run only where MLX has a CUDA GPU (the H200 benchmark machine); elsewhere the engine
never uses the kernel.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from kinfer.engines.mlx import blas  # noqa: F401
from kinfer.engines.mlx.kernels import fused_decode_available
from kinfer.engines.mlx.kv import BLOCK, PagedKV, PagedLayer, PassLayout
from kinfer.engines.mlx.split_decode import MAX_SPLITS, SPAN, SPLIT_FROM, splits_for

# float32 products on a GPU may run as TF32 (MLX's CUDA default): a looser bound there
F32_TOLERANCE = 1e-5 if mx.default_device() == mx.cpu else 5e-3

cuda = pytest.mark.skipif(
    not fused_decode_available(128, 128, mx.bfloat16), reason="the fused kernel exists only for MLX on CUDA"
)


def _setup(lengths, *, heads=16, kv_heads=8, dim=128, dtype=mx.bfloat16, window=None, seed=0):
    rng = np.random.default_rng(seed)
    blocks_needed = [(n + BLOCK - 1) // BLOCK for n in lengths]
    total = sum(blocks_needed) + 3
    ids = rng.permutation(total)  # scattered, not contiguous: tables must be followed
    table = np.zeros((len(lengths), max(blocks_needed)), dtype=np.int64)
    at = 0
    for i, n in enumerate(blocks_needed):
        table[i, :n] = ids[at : at + n]
        at += n
    layer = PagedLayer(window=window)
    layer.resize(total)
    layer.heads = kv_heads
    rows = total * kv_heads * BLOCK
    layer.keys = mx.array(rng.standard_normal((rows, dim)).astype(np.float32)).astype(dtype)
    layer.values = mx.array(rng.standard_normal((rows, dim)).astype(np.float32)).astype(dtype)
    layout = PassLayout(table, np.array(lengths) - 1, 1, decode=True)
    queries = mx.array(rng.standard_normal((len(lengths), heads, 1, dim)).astype(np.float32)).astype(dtype)
    return PagedKV(layer, layout), queries, table


def _dense(view, queries, table, lengths, scale, window=None):
    """Attention of each row over its own positions, in float32 numpy: the reference."""
    layer = view.layer
    keys = np.array(layer.blocks_view(layer.keys).astype(mx.float32))  # [blocks, kv_heads, BLOCK, dim]
    values = np.array(layer.blocks_view(layer.values).astype(mx.float32))
    q = np.array(queries.astype(mx.float32))[:, :, 0, :]
    heads, kv_heads = q.shape[1], keys.shape[1]
    out = np.zeros_like(q)
    for i, n in enumerate(lengths):
        pos = np.arange(max(0, n - window) if window else 0, n)
        k = keys[table[i, pos // BLOCK], :, pos % BLOCK]  # [n, kv_heads, dim]
        v = values[table[i, pos // BLOCK], :, pos % BLOCK]
        for h in range(heads):
            s = k[:, h // (heads // kv_heads)] @ q[i, h] * scale
            w = np.exp(s - s.max())
            out[i, h] = (w / w.sum()) @ v[:, h // (heads // kv_heads)]
    return out


def test_the_fused_kernel_gets_its_inputs_in_its_own_order(monkeypatch):
    """The engine's call into the kernel, checked where the kernel cannot run (this CPU): the launch
    sees the queries, the pools, the int32 tables and bounds in that order (a swapped pair once reached
    only the H200, where every decode pass failed)."""
    from kinfer.engines.mlx import kernels, kv

    launched = []

    def launch(call, inputs):
        launched.append(inputs)
        queries, values = inputs[0], inputs[2]
        return mx.zeros((*queries.shape[:3], values.shape[-1]), dtype=queries.dtype)

    monkeypatch.setattr(kv, "fused_decode_available", lambda *_: True)
    monkeypatch.setattr(kernels, "launch_jit", launch)
    view, queries, table = _setup([40, 300], dim=64)
    view.layer.fused_decode = True
    out = view.attend(queries, None, None, scale=0.125)
    assert out.shape == (2, 16, 1, 64)
    ((q, keys, values, tables, bounds),) = launched
    assert q.shape == queries.shape and keys is view.layer.keys and values is view.layer.values
    assert tables.dtype == mx.int32 and tables.tolist() == table[:, : tables.shape[1]].tolist()
    assert bounds.dtype == mx.int32 and bounds.tolist() == [[0, 40], [0, 300]]


def test_the_split_kernel_gets_its_inputs_in_its_own_order(monkeypatch):
    """The same for the split path (a long row, or the warm-up's forced split): spans, then merge."""
    from kinfer.engines.mlx import kv, split_decode

    launched = {}

    def kernel(name):
        def launch(*, inputs, output_shapes, output_dtypes, **_):
            launched[name] = inputs
            return [
                mx.zeros(shape, dtype=dtype)
                for shape, dtype in zip(output_shapes, output_dtypes, strict=True)
            ]

        return launch

    monkeypatch.setattr(kv, "fused_decode_available", lambda *_: True)
    monkeypatch.setattr(split_decode, "_spans", kernel("spans"))
    monkeypatch.setattr(split_decode, "_merge", kernel("merge"))
    view, queries, _ = _setup([40, 300], dim=64)
    view.layer.fused_decode = True
    view.layout.min_splits = 4
    out = view.attend(queries, None, None, scale=0.125)
    assert out.shape == (2, 16, 1, 64)
    q, keys, values, tables, bounds, scale = launched["spans"]
    assert q.shape == queries.shape and keys is view.layer.keys and values is view.layer.values
    assert tables.dtype == mx.int32 and bounds.tolist() == [[0, 40], [0, 300]]
    assert scale.item() == 0.125
    part, ml = launched["merge"]
    assert part.shape == (2, 8, 4, 2, 64) and ml.shape == (2, 8, 4, 2, 2)


@cuda
@pytest.mark.parametrize("lengths", [[1], [5, 64, 65, 300], [2000, 3, 129] * 8])
@pytest.mark.parametrize("shape", [(16, 8, 128), (8, 2, 256)])
def test_fused_kernel_matches_portable_path(lengths, shape):
    heads, kv_heads, dim = shape
    view, queries, table = _setup(lengths, heads=heads, kv_heads=kv_heads, dim=dim)
    fused = view.attend(queries, None, None, scale=dim**-0.5).astype(mx.float32)
    portable = view._attend_decode_ops(queries, dim**-0.5, None).astype(mx.float32)
    assert fused.shape == portable.shape == (len(lengths), heads, 1, dim)
    expected = _dense(view, queries, table, lengths, dim**-0.5)
    # bf16 output rounding; the portable path also rounds its scores to bf16
    assert np.abs(np.array(fused)[:, :, 0] - expected).max() < 2e-2
    assert np.abs(np.array(portable)[:, :, 0] - expected).max() < 6e-2


@cuda
def test_fused_kernel_honours_a_sliding_window():
    lengths = [40, 500, 130]
    view, queries, table = _setup(lengths, window=100, dtype=mx.float32)
    fused = np.array(view.attend(queries, None, None, scale=0.1))[:, :, 0]
    portable = np.array(view._attend_decode_ops(queries, 0.1, None))[:, :, 0]
    expected = _dense(view, queries, table, lengths, 0.1, window=100)
    assert np.abs(fused - expected).max() < 1e-4
    assert np.abs(portable - expected).max() < max(1e-4, F32_TOLERANCE)


@cuda
def test_a_layer_with_fused_decode_off_takes_the_portable_path():
    # what --mlx-fused-decode off (KINFER_MLX_FUSED_DECODE=0) sets on every paged layer
    view, queries, _table = _setup([5, 64, 300])
    view.layer.fused_decode = False
    attended = np.array(view.attend(queries, None, None, scale=0.1).astype(mx.float32))
    portable = np.array(view._attend_decode_ops(queries, 0.1, None).astype(mx.float32))
    assert np.array_equal(attended, portable)


def test_a_pass_splits_its_rows_only_once_one_attends_past_the_threshold():
    assert [splits_for(n) for n in (1, SPAN + 1, SPLIT_FROM, SPLIT_FROM + 1, 50_000)] == [1, 1, 1, 32, 64]
    assert splits_for(10**6) == MAX_SPLITS  # past MAX_SPLITS spans, the spans grow
    table = np.zeros((3, 2000), dtype=np.int64)
    assert PassLayout(table, np.array([5, 70, 30_000]), 1, decode=True).decode_splits(None) == 32
    # a sliding window bounds what a row attends to, however long the row
    assert PassLayout(table, np.array([5, 70, 30_000]), 1, decode=True).decode_splits(500) == 1


@cuda
@pytest.mark.parametrize("lengths", [[50_000, 7, 1500], [SPLIT_FROM + 1], [3000, MAX_SPLITS * SPAN + 4500]])
@pytest.mark.parametrize("shape", [(16, 8, 128), (8, 2, 256)])
def test_long_rows_split_into_spans_and_merge_to_the_same_attention(lengths, shape):
    from kinfer.engines.mlx.kernels import paged_decode_attention

    heads, kv_heads, dim = shape
    view, queries, table = _setup(lengths, heads=heads, kv_heads=kv_heads, dim=dim)
    assert view.layout.decode_splits(None) > 1
    split = np.array(view.attend(queries, None, None, scale=dim**-0.5).astype(mx.float32))[:, :, 0]
    tables, bounds = view.layout.kernel_inputs(None)
    layer = view.layer
    whole = paged_decode_attention(
        queries, layer.keys, layer.values, kv_heads, BLOCK, tables, bounds, dim**-0.5
    )
    whole = np.array(whole.astype(mx.float32))[:, :, 0]
    expected = _dense(view, queries, table, lengths, dim**-0.5)
    assert np.abs(split - expected).max() < 2e-2
    assert np.abs(split - whole).max() < 2e-2


@cuda
def test_short_rows_split_many_ways_leave_empty_spans_out_of_the_merge():
    # what the warm-up runs: the split path on rows shorter than a span (most spans empty)
    lengths = [1, 5, 300, 1000]
    view, queries, table = _setup(lengths, dtype=mx.float32)
    view.layout.min_splits = 16
    got = np.array(view.attend(queries, None, None, scale=0.1))[:, :, 0]
    assert np.abs(got - _dense(view, queries, table, lengths, 0.1)).max() < 1e-4


@cuda
def test_a_split_pass_honours_a_sliding_window():
    lengths = [50_000, 40, 17_000]
    view, queries, table = _setup(lengths, window=20_000, dtype=mx.float32)
    assert view.layout.decode_splits(20_000) == 32
    got = np.array(view.attend(queries, None, None, scale=0.1))[:, :, 0]
    assert np.abs(got - _dense(view, queries, table, lengths, 0.1, window=20_000)).max() < 1e-4


def test_portable_path_matches_dense_attention():
    """The path every non-CUDA device uses: split over each row's blocks, merged per row."""
    lengths = [1, 64, 65, 200, 7]
    view, queries, table = _setup(lengths, heads=4, kv_heads=2, dim=16, dtype=mx.float32)
    portable = np.array(view._attend_decode_ops(queries, 0.25, None))[:, :, 0]
    assert np.abs(portable - _dense(view, queries, table, lengths, 0.25)).max() < F32_TOLERANCE
    view, queries, table = _setup(lengths, heads=4, kv_heads=2, dim=16, dtype=mx.float32, window=50)
    portable = np.array(view._attend_decode_ops(queries, 0.25, None))[:, :, 0]
    assert np.abs(portable - _dense(view, queries, table, lengths, 0.25, window=50)).max() < F32_TOLERANCE


@cuda
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float32])
def test_the_precompiled_kernel_is_taken_and_agrees_with_the_jit_kernel(dtype):
    from kinfer.engines.mlx import kernels
    from kinfer.engines.mlx.precompiled import outputs_agree

    view, queries, _table = _setup([1, 5, 64, 300, 2000], dtype=dtype)
    layer = view.layer
    tables, bounds = view.layout.kernel_inputs(layer.window)
    inputs = (queries.astype(layer.keys.dtype), layer.keys, layer.values, tables, bounds)
    call = kernels.launch_for(*inputs, layer.heads, BLOCK, 0.1)
    binary = kernels.resolve_precompiled(call)
    assert binary is not None, kernels._precompiled.disabled
    got = kernels.launch_precompiled(call, binary, inputs)
    want = kernels.launch_jit(call, inputs)
    assert outputs_agree([got], [want]) is None  # the same body: the same bits, or one rounding apart
    assert mx.array_equal(view.attend(queries, None, None, scale=0.1), want)  # the default: JIT
    layer.precompiled = True  # --mlx-precompiled-kernels on
    assert mx.array_equal(view.attend(queries, None, None, scale=0.1), got)
