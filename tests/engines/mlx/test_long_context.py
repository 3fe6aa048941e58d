"""One row's prompt chunk past SHORT_CONTEXT keys on CUDA (long_context.py): its keys and values taken
out of the paged pool in one copy each, already in cuDNN's layout and padded to the key bucket, where
the block gather, its transpose and the padding took three. The same attention either way: the rows read
mlx-lm's greedy tokens."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from kinfer.engines.mlx import long_context, shape_buckets
from kinfer.engines.mlx.attention_ops import SHORT_CONTEXT
from kinfer.engines.mlx.kv import BLOCK, PagedKV
from kinfer.engines.mlx.shape_buckets import bucket
from tests.engines.mlx.fixtures import *  # noqa: F403
from tests.engines.mlx.fixtures import chat, job, mlx_lm_greedy, readable, run_jobs
from tests.engines.mlx.test_warm_up import trained_longer


@pytest.fixture
def padded():
    shape_buckets.set_enabled(True)
    yield
    shape_buckets.set_enabled(None)


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
