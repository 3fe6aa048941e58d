"""Automatic sizing of the llama.cpp context: rows, tokens per row, pool slots (pure arithmetic)."""

from __future__ import annotations

import pytest

from kinfer.engines.llama.sizing import plan_size
from kinfer.errors import InvalidRequest

GIB = 2**30
KV_PER_TOKEN = 128 * 1024  # an 8B-class model: 32 layers x 8 KV heads x 256 dims x 2 bytes


def plan(**kw):
    args = dict(
        rows=0,
        ctx=0,
        threads=0,
        prefix_cache=True,
        gpu=False,
        train_context=32768,
        kv_bytes_per_token=KV_PER_TOKEN,
        max_sequences=256,
        free_memory=64 * GIB,
    )
    args.update(kw)
    return plan_size(**args)


def test_defaults_are_four_rows_of_4096_on_cpu_and_sixteen_with_a_gpu():
    cpu, gpu = plan(), plan(gpu=True)

    assert (cpu.rows, cpu.ctx, cpu.pool_slots) == (4, 4096, 4)
    assert (gpu.rows, gpu.ctx, gpu.pool_slots) == (16, 4096, 16)
    assert cpu.n_ctx == (4 + 4) * 4096
    assert cpu.threads >= 1


def test_the_row_length_never_exceeds_the_train_context_and_is_padded_like_llama_cpp():
    assert plan(train_context=2048).ctx == 2048
    assert plan(ctx=1000).ctx == 1024


def test_automatic_rows_then_context_shrink_to_fit_half_the_free_memory():
    # 16 rows + 16 pool slots x 4096 tokens x 128 KiB = 16 GiB; half of 10 GiB free allows 5 GiB
    fitted = plan(gpu=True, free_memory=10 * GIB)
    assert (fitted.rows, fitted.ctx) == (4, 4096)
    assert fitted.n_ctx * KV_PER_TOKEN <= 5 * GIB

    tight = plan(free_memory=3 * GIB // 2)  # one row and its pool slot at 4096 would need 1 GiB
    assert tight.rows == 1 and tight.ctx == 2048


def test_explicit_settings_are_kept_when_they_fit_in_free_memory():
    explicit = plan(rows=8, ctx=8192, threads=3, free_memory=16 * GIB)

    assert (explicit.rows, explicit.ctx, explicit.threads) == (8, 8192, 3)


def test_explicit_settings_that_cannot_fit_are_refused_not_allocated():
    with pytest.raises(InvalidRequest, match="smaller context"):
        plan(rows=8, ctx=8192, free_memory=GIB // 64)


def test_an_explicit_context_beyond_training_is_capped():
    assert plan(ctx=10**9, train_context=8192, free_memory=16 * GIB).ctx == 8192


def test_without_the_prefix_cache_there_are_no_pool_slots():
    assert plan(prefix_cache=False).pool_slots == 0


def test_sequence_ids_and_the_step_budget_have_room_for_every_row():
    capped = plan(rows=200, ctx=512, max_sequences=256)
    assert capped.n_seq <= 256

    assert plan(rows=8, ctx=512, step_tokens=4).n_batch == 8 + 16  # a row each, and 16 for prompts
    assert plan(step_tokens=64).n_ubatch == 64


def test_a_memory_budget_shrinks_automatic_rows_then_the_context():
    # 4 GiB of weights; 4 rows + 4 pool slots x 4096 tokens x 128 KiB = 4 GiB of KV
    fitted = plan(budget=6 * GIB, weights=4 * GIB)
    assert (fitted.rows, fitted.ctx) == (2, 4096)  # (2 + 2) x 4096 x 128 KiB: the 2 GiB left

    tighter = plan(budget=4 * GIB + GIB // 2, weights=4 * GIB)
    assert (tighter.rows, tighter.ctx) == (1, 2048)


def test_a_memory_budget_shrinks_explicit_rows_and_refuses_a_context_that_cannot_fit():
    assert plan(rows=8, ctx=4096, budget=6 * GIB, weights=4 * GIB).rows == 2
    with pytest.raises(InvalidRequest, match="memory budget"):
        plan(rows=1, ctx=32768, budget=6 * GIB, weights=4 * GIB)
    with pytest.raises(InvalidRequest, match="memory budget"):
        plan(budget=3 * GIB, weights=4 * GIB)


def test_the_budget_keeps_room_for_the_compute_buffers_and_recurrent_state():
    vocab = 150_000  # 4 bytes x 512 x 150,000 x 1.25: ~366 MiB of logits
    with_scratch = plan(budget=5 * GIB, weights=4 * GIB, n_vocab=vocab)
    without = plan(budget=5 * GIB, weights=4 * GIB)
    assert with_scratch.ctx < without.ctx

    state = plan(budget=5 * GIB, weights=4 * GIB, state_bytes_per_row=GIB // 8)
    assert state.ctx < without.ctx
