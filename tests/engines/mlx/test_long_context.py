"""One row's prompt chunk past SHORT_CONTEXT keys on CUDA (long_context.py): its keys and values taken
out of the paged pool in one copy each, already in cuDNN's layout and padded to the key bucket, where
the block gather, its transpose and the padding took three; on CUDA one kernel copies them whole
(long_kv_copy.py). The same attention either way: the rows read mlx-lm's greedy tokens.

The kernel's tests run only where MLX has a CUDA GPU (the H200 benchmark machine)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from kinfer.engines.mlx import kernels, long_context, long_kv_copy, shape_buckets
from kinfer.engines.mlx.attention_ops import SHORT_CONTEXT
from kinfer.engines.mlx.kv import BLOCK, PagedKV
from kinfer.engines.mlx.shape_buckets import bucket
from tests.engines.mlx.fixtures import *  # noqa: F403
from tests.engines.mlx.fixtures import chat, job, mlx_lm_greedy, readable, run_jobs
from tests.engines.mlx.test_warm_up import trained_longer

cuda = pytest.mark.skipif(not kernels.on_cuda_gpu(), reason="the copy kernel exists only for MLX on CUDA")


def test_the_rows_taken_are_the_rows_positions_head_by_head_then_the_buckets_padding():
    heads, dim, end = 3, 4, SHORT_CONTEXT + 70
    blocks = np.random.default_rng(0).permutation(2 * (end // BLOCK + 1))[: (end + BLOCK - 1) // BLOCK]
    pool = mx.arange(len(blocks) * 2 * heads * BLOCK * dim).reshape(-1, dim)
    got = long_context.gathered(pool, long_context.pool_rows(blocks, heads, BLOCK, end), heads)
    assert got.shape == (1, heads, bucket(end), dim)
    # what the engine gathered before: the row's blocks, [heads, positions], up to `end`
    view = pool.reshape(-1, heads, BLOCK, dim)[mx.array(blocks)]
    want = view.transpose(1, 0, 2, 3).reshape(1, heads, -1, dim)[:, :, :end]
    assert mx.array_equal(got[:, :, :end], want).item()
    assert mx.array_equal(got[:, :, end:], mx.broadcast_to(want[:, :, :1], got[:, :, end:].shape)).item()


def _scattered_pools(end: int, heads: int, dim: int, dtype=mx.float32, seed: int = 0):
    """Pools holding a row of `end` positions in scattered blocks (and other rows' blocks between)."""
    rng = np.random.default_rng(seed)
    needed = (end + BLOCK - 1) // BLOCK
    blocks = rng.permutation(2 * needed + 1)[:needed].astype(np.int32)
    size = (2 * needed + 1) * heads * BLOCK
    keys = mx.array(rng.standard_normal((size, dim)).astype(np.float32)).astype(dtype)
    values = mx.array(rng.standard_normal((size, dim)).astype(np.float32)).astype(dtype)
    return keys, values, blocks


def _taken(keys: mx.array, values: mx.array, blocks: np.ndarray, end: int, heads: int):
    rows = long_context.pool_rows(blocks, heads, BLOCK, end)
    return long_context.gathered(keys, rows, heads), long_context.gathered(values, rows, heads)


def test_without_the_kernel_the_row_context_is_taken_once_per_pass(monkeypatch):
    monkeypatch.setattr(long_context, "copy_kernel", False)
    heads, end = 2, SHORT_CONTEXT + 70
    keys, values, blocks = _scattered_pools(end, heads, dim=8)
    built: dict = {}
    read = []

    def row_blocks():
        read.append(1)
        return blocks

    for _ in range(2):  # two layers of one pass: the block table is read once, the rows built once
        got = long_context.row_context(keys, values, row_blocks, end, heads, BLOCK, built)
    for have, want in zip(got, _taken(keys, values, blocks, end, heads), strict=True):
        assert mx.array_equal(have, want).item()
    assert list(built) == [("long rows", heads)]  # the pass's other layers reuse the rows
    assert len(read) == 1


def test_with_the_kernel_a_passs_first_layer_builds_its_inputs_and_every_layer_copies(monkeypatch):
    monkeypatch.setattr(long_context, "copy_kernel", True)
    calls = []
    monkeypatch.setattr(long_kv_copy, "copy_row", lambda *a: calls.append(a) or ("k", "v"))
    heads, end = 2, SHORT_CONTEXT + 70
    keys, values, blocks = _scattered_pools(end, heads, dim=8)
    built: dict = {}
    read = []
    for _ in range(3):  # three layers of one pass
        got = long_context.row_context(
            keys, values, lambda: read.append(1) or blocks, end, heads, BLOCK, built
        )
    assert got == ("k", "v") and len(calls) == 3 and len(read) == 1
    ids, last = calls[0][2], calls[0][3]
    assert np.array_equal(np.array(ids), blocks) and last.tolist() == [end]
    assert calls[0][4:] == (heads, BLOCK, bucket(end))


@cuda
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float32])
@pytest.mark.parametrize("end", [SHORT_CONTEXT + 1, SHORT_CONTEXT + 70, 2 * SHORT_CONTEXT, 30_001])
def test_the_kernel_copies_the_rows_positions_and_zeros_the_padding(dtype, end):
    heads, dim = 8, 128
    keys, values, blocks = _scattered_pools(end, heads, dim, dtype, seed=end)
    width = bucket(end)
    got_k, got_v = long_kv_copy.copy_row(
        keys, values, mx.array(blocks), mx.array([end], dtype=mx.int32), heads, BLOCK, width
    )
    want_k, want_v = _taken(keys, values, blocks, end, heads)
    for got, want in ((got_k, want_k), (got_v, want_v)):
        assert got.shape == want.shape == (1, heads, width, dim) and got.dtype == dtype
        assert mx.array_equal(got[:, :, :end], want[:, :, :end]).item()
        assert not mx.any(got[:, :, end:]).item()  # the padding is zeros, never another row's values


@cuda
def test_on_cuda_the_row_context_is_the_kernels(monkeypatch):
    calls = []
    real = long_kv_copy.copy_row
    monkeypatch.setattr(long_kv_copy, "copy_row", lambda *a: calls.append(a) or real(*a))
    heads, end = 8, SHORT_CONTEXT + 70
    keys, values, blocks = _scattered_pools(end, heads, dim=128, dtype=mx.bfloat16)
    built: dict = {}
    for _ in range(2):  # two layers of one pass: one set of inputs
        got = long_context.row_context(keys, values, lambda: blocks, end, heads, BLOCK, built)
    assert len(calls) == 2 and list(built) == [("long copy", end)]
    for have, want in zip(got, _taken(keys, values, blocks, end, heads), strict=True):
        assert mx.array_equal(have[:, :, :end], want[:, :, :end]).item()


def test_the_mask_hides_the_future_the_window_and_the_padding():
    mask = np.array(long_context.long_mask(start=SHORT_CONTEXT, length=3, window=None))[0, 0]
    assert mask.shape == (3, bucket(SHORT_CONTEXT + 3))
    for i in range(3):
        assert mask[i].sum() == SHORT_CONTEXT + i + 1 and mask[i, : SHORT_CONTEXT + i + 1].all()
    windowed = np.array(long_context.long_mask(start=SHORT_CONTEXT, length=3, window=100))[0, 0]
    assert [int(row.sum()) for row in windowed] == [100, 100, 100]


def test_only_one_rows_chunks_past_the_short_context_with_the_buckets_on_take_it(padded):
    assert long_context.takes_long_path(1, SHORT_CONTEXT + 1)
    assert not long_context.takes_long_path(1, SHORT_CONTEXT)
    assert not long_context.takes_long_path(2, SHORT_CONTEXT + 1)  # several rows: the batched gather
    shape_buckets.set_enabled(False)
    assert not long_context.takes_long_path(1, SHORT_CONTEXT + 1)  # a CPU: nothing is padded


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_a_prompt_past_the_short_context_in_chunks_reads_mlx_lms_tokens(
    arch, tiny_models, tmp_path, make_mlx, padded, monkeypatch
):
    path = trained_longer(tiny_models[arch], tmp_path)
    taken = []
    real = PagedKV._attend_prefill_long
    monkeypatch.setattr(PagedKV, "_attend_prefill_long", lambda self, *a: taken.append(1) or real(self, *a))
    engine = make_mlx(path, rows=2, ctx=6000, prefill_chunk=512, warm_up=False)
    prompt = engine.tokenize(chat(" ".join(f"item {i}," for i in range(620))))
    assert SHORT_CONTEXT + 512 < len(prompt) < 6000 - 8
    results = run_jobs(engine, [job("long", prompt, max_tokens=8)])
    assert taken  # its last chunks went this way
    assert readable(results["long"].text) == mlx_lm_greedy(path, prompt, 8)[1]


def test_beside_decoding_rows_a_long_prompts_chunks_keep_one_length_while_a_burst_arrives(
    tiny_models, tmp_path, make_mlx, padded, monkeypatch
):
    """CUDA's untimed budget (forced here): past SHORT_CONTEXT the long prompt's chunks stay 256 tokens
    (the warm-up's shape) while a burst's prompts take the rest of the step's share, and every reply
    still reads mlx-lm's greedy tokens."""
    from kinfer.engines.mlx import engine as engine_module

    path = trained_longer(tiny_models["qwen3"], tmp_path)
    engine = make_mlx(path, rows=9, ctx=8000, prefill_chunk=2048, warm_up=False)
    monkeypatch.setattr(engine._clock.budget, "timed", False)
    planned = []
    real_plan = engine_module.plan_prefill

    def plan(rows, budget, **kw):
        passes = real_plan(rows, budget, **kw)
        planned.extend(
            (r.job.job_id, r.fed, c) for p in passes for r, c in zip(p.rows, p.chunks, strict=True)
        )
        return passes

    monkeypatch.setattr(engine_module, "plan_prefill", plan)
    prompt = engine.tokenize(chat(" ".join(f"item {i}," for i in range(900))))
    short = [engine.tokenize(chat(f"question {i}")) for i in range(8)]
    streaming = [job(f"s{i}", short[i], max_tokens=40, ignore_eos=True) for i in range(2)]
    burst = [job(f"b{i}", short[2 + i], max_tokens=4) for i in range(6)]

    def arrive(step: int, results) -> None:
        if step in (12, 16):  # the long prompt is past SHORT_CONTEXT by then (256 tokens a step)
            for j in burst[:3] if step == 12 else burst[3:]:
                engine.submit(j)

    results = run_jobs(engine, [*streaming, job("long", prompt, max_tokens=6)], on_step=arrive)
    deep = [
        (fed, chunk)
        for job_id, fed, chunk in planned
        if job_id == "long" and bucket(fed + chunk) > SHORT_CONTEXT
    ]
    assert deep and all(chunk == 256 or fed + chunk == len(prompt) - 1 for fed, chunk in deep)
    assert any(job_id.startswith("b") for job_id, _, _ in planned)  # the burst was prefilled beside it
    assert readable(results["long"].text) == mlx_lm_greedy(path, prompt, 6)[1]
    for j in [*streaming, *burst]:
        assert readable(results[j.job_id].text) == mlx_lm_greedy(path, j.prompt, j.max_tokens)[1]


def test_the_composition_takes_a_long_chunk_while_its_scores_fit():
    # qwen3-0.6b's 16 heads: a 256-query chunk's scores at 65,536 keys are 512 MiB; a prompt alone, in
    # 2,048-token chunks, keeps cuDNN from 8,192 keys on
    assert long_context.ops_fit(1, 16, 256, 65536) and not long_context.ops_fit(1, 16, 256, 65536 + 64)
    assert long_context.ops_fit(1, 16, 2048, 8192) and not long_context.ops_fit(1, 16, 2048, 10240)
