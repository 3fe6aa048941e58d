"""Decode passes padded to a few row counts (shape_buckets.decode_rows, on CUDA): the padding rows all
point at a scratch slot past the real ones, and whatever they compute is dropped. The real rows must
not notice: the same tokens as unpadded, greedy or sampled, with penalties, for attention-only and
recurrent models, while rows join and leave (the padded size changes under them)."""

from __future__ import annotations

from kinfer.engines.mlx import shape_buckets
from kinfer.engines.mlx.shape_buckets import decode_rows
from kinfer.protocol import Sampling
from tests.engines.mlx.fixtures import *  # noqa: F403
from tests.engines.mlx.fixtures import chat, cpu_numerics, job, mlx_lm_greedy, readable, run_jobs
from tests.engines.mlx.test_engine import QUESTIONS

LONGEST = 16


def test_a_few_sizes_one_stream_stays_one_row_and_a_full_batch_takes_every_slot():
    assert [decode_rows(n, 64) for n in (1, 5, 8)] == [1, 5, 8]
    assert [decode_rows(n, 64) for n in (9, 17, 33, 63)] == [16, 20, 40, 64]
    assert decode_rows(64, 64) == 65  # every slot and the scratch one: in order, no gather
    assert decode_rows(11, 12) == 13  # never past the slots plus the scratch one
    # a small engine's full batch keeps its own size (one stream of a one-slot engine: one row)
    assert [decode_rows(1, 1), decode_rows(3, 3), decode_rows(8, 8), decode_rows(9, 9)] == [1, 3, 8, 10]
    assert len({decode_rows(n, 256) for n in range(1, 257)}) <= 8 + 4 * 5 + 1


def staggered(engine, sampling=None):
    """Jobs that end at different steps, so the decode batch shrinks 11 -> 1 under the padding; the
    longest runs in slot 0, where a padding row pointed at a real slot would write first."""
    prompts = [engine.tokenize(chat(QUESTIONS[i % len(QUESTIONS)] + " and" * i)) for i in range(11)]
    extra = {} if sampling is None else {"sampling": sampling}
    jobs = [job(f"p{i}", p, max_tokens=LONGEST - i, **extra) for i, p in enumerate(prompts)]
    return prompts, run_jobs(engine, jobs)


def test_padded_rows_leave_the_greedy_tokens_as_mlx_lms(tiny_qwen3, make_mlx, padded):
    engine = make_mlx(tiny_qwen3, rows=12)
    assert engine._batch.pad
    prompts, results = staggered(engine)
    for i, prompt in enumerate(prompts):
        assert readable(results[f"p{i}"].text) == mlx_lm_greedy(tiny_qwen3, prompt, LONGEST - i)[1], i


@cpu_numerics
def test_a_recurrent_models_state_is_untouched_by_the_padding(tiny_qwen35, make_mlx, padded):
    engine = make_mlx(tiny_qwen35, rows=12)
    prompts, results = staggered(engine)
    for i, prompt in enumerate(prompts):
        assert readable(results[f"p{i}"].text) == mlx_lm_greedy(tiny_qwen35, prompt, LONGEST - i)[1], i


@cpu_numerics
def test_a_full_batch_runs_every_slot_in_order_with_the_scratch_one(tiny_qwen35, make_mlx, padded):
    rows = shape_buckets.EXACT_DECODE_ROWS + 1  # past the exact sizes: the full batch's own shape
    engine = make_mlx(tiny_qwen35, rows=rows, prefill_chunk=2048)  # every prompt in the first step
    prompts = [engine.tokenize(chat(QUESTIONS[i % len(QUESTIONS)] + " and" * i)) for i in range(rows)]
    sizes = []
    plan = engine._batch.plan
    engine._batch.plan = lambda batch: sizes.append(len(plan(batch).slots)) or plan(batch)
    results = run_jobs(engine, [job(f"p{i}", p, max_tokens=LONGEST) for i, p in enumerate(prompts)])
    assert max(sizes) == rows + 1
    for i, prompt in enumerate(prompts):
        assert readable(results[f"p{i}"].text) == mlx_lm_greedy(tiny_qwen35, prompt, LONGEST)[1], i


def test_one_stream_of_a_one_slot_engine_is_a_one_row_pass(tiny_qwen3, make_mlx, padded):
    # not two (its slot and the scratch one): on CUDA one row's products run on MLX's GEMV kernel
    engine = make_mlx(tiny_qwen3, rows=1)
    sizes = []
    plan = engine._batch.plan
    engine._batch.plan = lambda batch: sizes.append(len(plan(batch).slots)) or plan(batch)
    prompt = engine.tokenize(chat(QUESTIONS[1]))
    result = run_jobs(engine, [job("p", prompt, max_tokens=6)])["p"]
    assert sizes and set(sizes) == {1}
    assert readable(result.text) == mlx_lm_greedy(tiny_qwen3, prompt, 6)[1]


def test_sampled_rows_with_penalties_draw_the_same_tokens_padded_or_not(tiny_qwen3, make_mlx):
    sampling = Sampling(temperature=0.9, seed=7, repeat_penalty=1.3, presence_penalty=0.5)
    texts = {}
    for pad in (False, True):
        shape_buckets.set_enabled(pad)
        try:
            engine = make_mlx(tiny_qwen3, rows=12)
            assert engine._batch.pad == pad
            _, results = staggered(engine, sampling)
            texts[pad] = {key: result.text for key, result in results.items()}
        finally:
            shape_buckets.set_enabled(None)
    assert texts[True] == texts[False]


def test_the_scratch_block_comes_on_top_of_every_rows_full_context(tiny_qwen3, make_mlx, padded):
    """Without a prefix pool the rows may hold exactly rows x ctx of KV: the scratch slot's block must
    not take one of theirs (the H200 bench ran out of blocks at 64 rows of full context)."""
    engine = make_mlx(tiny_qwen3, rows=3, ctx=192, prefix_cache=False)
    longest = max(QUESTIONS, key=len)  # every prompt past two blocks: each row holds all three at once
    prompts = [engine.tokenize(chat(longest + " and" * i)) for i in range(3)]
    assert all(128 < len(p) < 190 for p in prompts), [len(p) for p in prompts]
    jobs = [job(f"p{i}", p, max_tokens=192 - len(p), ignore_eos=True) for i, p in enumerate(prompts)]
    results = run_jobs(engine, jobs)
    assert all(result.finish == "length" for result in results.values())
