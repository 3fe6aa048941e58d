"""Prefill attention padded to a few shapes (sdpa_buckets.py): on CUDA each new attention shape costs a
cuDNN graph build, so passes are padded to buckets; the real rows must get the same attention."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from kinfer.engines.mlx import long_context, sdpa_buckets
from kinfer.engines.mlx.attention_ops import SHORT_CONTEXT
from kinfer.engines.mlx.sdpa_buckets import LONG_CONTEXT_QUERIES, bucketed_sdpa
from kinfer.engines.mlx.shape_buckets import bucket, bucket_floor, row_bucket
from tests.engines.mlx.fixtures import *  # noqa: F403
from tests.engines.mlx.fixtures import chat, job, mlx_lm_greedy, readable, run_jobs
from tests.engines.mlx.test_burst import pooled_and_fresh_prompts
from tests.engines.mlx.test_engine import QUESTIONS

HEADS, KV_HEADS, DIM = 4, 2, 16
# the padded path composes attention from matrix products, which MLX's CUDA backend runs in TF32 for
# float32 (differences of ~1e-4 on the H200, 2026-12-02); on a CPU the two agree to rounding
ATOL = 1e-5 if mx.default_device() == mx.cpu else 2e-3


def test_the_ladder_pads_at_most_a_quarter_with_four_sizes_a_doubling():
    sizes = [bucket(n) for n in range(1, 4097)]
    assert all(size >= n for n, size in enumerate(sizes, start=1))
    assert all(size <= max(16, 1.25 * n) for n, size in enumerate(sizes, start=1))
    assert len(set(sizes)) <= 1 + 4 * 8  # 16, then four sizes in each doubling up to 4,096
    assert [row_bucket(n) for n in (1, 2, 3, 5, 9, 64)] == [1, 2, 4, 8, 16, 64]


def attention(batch: int, length: int, context: int, seed: int = 0):
    rng = np.random.default_rng(seed)

    def draw(*shape):
        return mx.array(rng.standard_normal(shape).astype(np.float32))

    return (
        draw(batch, HEADS, length, DIM),
        draw(batch, KV_HEADS, context, DIM),
        draw(batch, KV_HEADS, context, DIM),
    )


def plain(q, k, v, mask, sinks=None):
    if sinks is None:
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=mask)
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=mask, sinks=sinks)


@pytest.mark.parametrize(
    ("batch", "length", "context", "mask"),
    [
        (3, 37, 37, "causal"),  # fresh rows: padded alike, still plain causal
        (1, 20, 53, "causal"),  # a continued chunk: causal from the bottom right
        (2, 5, 19, None),
        (1, 16, 16, "causal"),  # already a bucket: untouched
    ],
)
def test_padded_attention_equals_the_unpadded(batch, length, context, mask):
    q, k, v = attention(batch, length, context)
    got = bucketed_sdpa(q, k, v, 0.25, mask, None)
    assert got.shape == (batch, HEADS, length, DIM)
    assert mx.allclose(got, plain(q, k, v, mask), atol=ATOL).item()


@pytest.mark.parametrize("mask", ["causal", "array"])
def test_past_the_short_context_a_short_chunk_pads_to_a_long_chunk_and_keeps_its_attention(mask):
    # a long prompt's last chunk: past SHORT_CONTEXT keys queries pad to the chunk the warm-up plans for
    length, context = 20, SHORT_CONTEXT + 300
    q, k, v = attention(1, length, context, seed=5)
    if mask == "array":
        mask = mx.array(np.arange(context)[None, :] <= np.arange(length)[:, None] + context - length)
    seen = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sdpa_buckets, "_sdpa", lambda q, k, *rest: seen.append((q.shape[2], k.shape[2])) or q)
        bucketed_sdpa(q, k, v, 0.25, mask, None)
    assert seen == [(LONG_CONTEXT_QUERIES, bucket(context))]
    got = bucketed_sdpa(q, k, v, 0.25, mask, None)
    assert mx.allclose(got, plain(q, k, v, mask), atol=ATOL).item()


def test_past_the_short_context_a_full_chunks_queries_reach_cudnn_as_a_copy_like_a_padded_ones():
    # cuDNN keys its plan on the queries' strides: a projection's transposed view and a padded copy
    # would be two plans for one shape, and the warm-up builds one
    _, k, v = attention(1, LONG_CONTEXT_QUERIES, bucket(SHORT_CONTEXT + 1), seed=6)
    view = mx.zeros((1, LONG_CONTEXT_QUERIES, HEADS, DIM)).transpose(0, 2, 1, 3)  # as projections give
    passed = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sdpa_buckets, "_sdpa", lambda q, *rest: passed.append(q) or q)
        bucketed_sdpa(view, k, v, 0.25, "causal", None)
    assert passed[0] is not view and passed[0].shape == view.shape


@pytest.mark.parametrize("context", [SHORT_CONTEXT + 300, bucket(SHORT_CONTEXT + 300)])  # padded, exact
def test_past_the_short_context_cudnn_gets_one_additive_mask_per_pass_not_a_boolean_one(context):
    # given a boolean mask MLX makes cuDNN a bias over every query head on every call (1.25 ms against
    # 0.27 ms per layer on the H200 at 30,000 keys): the pass makes it once, [1, 1, L, K], for its layers
    length = LONG_CONTEXT_QUERIES
    q, k, v = attention(1, length, context, seed=7)
    mask = mx.array(np.arange(context)[None, :] <= np.arange(length)[:, None] + context - length)
    built: dict = {}
    masks = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sdpa_buckets, "_sdpa", lambda q, k, v, scale, m, sinks: masks.append(m) or q)
        for _layer in range(2):
            bucketed_sdpa(q, k, v, 0.25, mask, None, built=built, key=("row", 0, None))
    assert masks[0] is masks[1]  # made once, for every layer of the pass
    assert masks[0].dtype == q.dtype and masks[0].shape == (1, 1, length, bucket(context))
    got = bucketed_sdpa(q, k, v, 0.25, mask, None, built=built, key=("row", 0, None))
    assert mx.allclose(got, plain(q, k, v, mask), atol=ATOL).item()


def test_a_per_row_mask_and_sinks_survive_the_padding():
    batch, length, context = 3, 10, 70
    q, k, v = attention(batch, length, context, seed=1)
    rng = np.random.default_rng(2)
    mask = rng.random((batch, 1, length, context)) < 0.3
    mask[..., 0] = True  # every query sees something
    sinks = mx.array(rng.standard_normal(HEADS).astype(np.float32))
    got = bucketed_sdpa(q, k, v, 0.25, mx.array(mask), sinks)
    assert mx.allclose(got, plain(q, k, v, mx.array(mask), sinks), atol=ATOL).item()
    assert not mx.isnan(got).any().item()


def test_an_additive_mask_is_left_unpadded():
    q, k, v = attention(2, 7, 23, seed=3)
    bias = mx.array(np.random.default_rng(4).standard_normal((2, 1, 7, 23)).astype(np.float32))
    assert mx.allclose(bucketed_sdpa(q, k, v, 0.25, bias, None), plain(q, k, v, bias), atol=1e-5).item()


def test_with_buckets_padded_continued_and_reused_prompts_give_mlx_lms_tokens(tiny_qwen3, make_mlx, padded):
    path = tiny_qwen3
    engine = make_mlx(path, rows=6, prefill_chunk=48)  # small chunks: prompts continue over steps
    prompts = pooled_and_fresh_prompts(engine)
    shapes = []
    forward = engine.forward

    def recording(inputs, views):
        if inputs.shape[1] > 1:
            shapes.append(inputs.shape)
        return forward(inputs, views)

    engine.forward = recording
    results = run_jobs(engine, [job(f"p{i}", p, max_tokens=8) for i, p in enumerate(prompts)])
    assert results["p0"].reused_tokens and results["p1"].reused_tokens
    # every prefill pass a few shapes: rows a power of two (copies of the last row), length on the ladder
    assert any(rows > 1 for rows, _ in shapes)
    assert all(rows == row_bucket(rows) and length in (bucket(length), *range(16)) for rows, length in shapes)
    for i, prompt in enumerate(prompts):
        assert readable(results[f"p{i}"].text) == mlx_lm_greedy(path, prompt, 8)[1], i


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_with_buckets_three_prompts_run_as_four_rows_and_keep_their_tokens(
    arch, tiny_models, make_mlx, padded
):
    path = tiny_models[arch]
    engine = make_mlx(path, rows=4, prefill_chunk=512)
    prompts = [engine.tokenize(chat(QUESTIONS[1] + " and" * i)) for i in range(3)]  # one pass: 24-26 tokens
    shapes = []
    forward = engine.forward
    engine.forward = lambda inputs, views: shapes.append(inputs.shape) or forward(inputs, views)
    results = run_jobs(engine, [job(f"p{i}", p, max_tokens=8) for i, p in enumerate(prompts)])
    assert shapes[0] == (4, bucket(max(len(p) for p in prompts) - 1))  # the last row twice more
    for i, prompt in enumerate(prompts):
        assert readable(results[f"p{i}"].text) == mlx_lm_greedy(path, prompt, 8)[1], i


def test_with_buckets_a_hybrid_models_replies_are_mlx_lms(tiny_qwen35, make_mlx, padded):
    engine = make_mlx(tiny_qwen35, rows=3, prefill_chunk=40)
    prompts = [engine.tokenize(chat(question)) for question in QUESTIONS[:3]]
    results = run_jobs(engine, [job(f"p{i}", p, max_tokens=8) for i, p in enumerate(prompts)])
    for i, prompt in enumerate(prompts):
        assert readable(results[f"p{i}"].text) == mlx_lm_greedy(tiny_qwen35, prompt, 8)[1], i


def test_the_floor_of_the_ladder_is_a_ladder_size_at_most_n():
    for n in range(17, 3000):
        assert bucket_floor(n) <= n and bucket(bucket_floor(n)) == bucket_floor(n)
        assert bucket_floor(n) > n * 0.75  # at most a quarter cut


@pytest.mark.parametrize(("scores_max", "path"), [(1 << 30, "composition"), (1 << 10, "cudnn")])
def test_past_the_short_context_a_chunk_is_the_composition_while_its_scores_fit(scores_max, path):
    # cuDNN walks every key once per 64-query tile, whatever the chunk: at a long prompt's 256-query
    # chunks the composition's two products take less time (long_context.py); a chunk whose scores
    # would not fit keeps cuDNN's flash attention
    length, context = LONG_CONTEXT_QUERIES, SHORT_CONTEXT + 300
    q, k, v = attention(1, length, context, seed=8)
    fused = []
    real = mx.fast.scaled_dot_product_attention
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(long_context, "OPS_SCORES_MAX", scores_max)
        patch.setattr(
            mx.fast, "scaled_dot_product_attention", lambda *a, **kw: fused.append(1) or real(*a, **kw)
        )
        got = bucketed_sdpa(q, k, v, 0.25, "causal", None)
    assert bool(fused) == (path == "cudnn")
    assert mx.allclose(got, plain(q, k, v, "causal"), atol=ATOL).item()


def test_past_the_short_context_the_mask_is_added_by_the_first_product():
    # the pass's one additive mask ([1, 1, L, K], _long_additive_mask) goes into mx.addmm: no pass of its own
    # over the scores (on the H200 0.41 ms against 0.58 for 256 queries over 28,672 keys)
    length, context = 40, SHORT_CONTEXT + 300
    q, k, v = attention(1, length, context, seed=9)
    mask = mx.array(np.arange(context)[None, :] <= np.arange(length)[:, None] + context - length)
    products = []
    real = sdpa_buckets.attention_bias_in_product
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sdpa_buckets, "attention_bias_in_product", lambda *a: products.append(1) or real(*a))
        got = bucketed_sdpa(q, k, v, 0.25, mask, None)
    assert products
    assert mx.allclose(got, plain(q, k, v, mask), atol=ATOL).item()
