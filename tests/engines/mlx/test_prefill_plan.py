"""How a step's prompt chunks are cut into forward passes (rows.plan_prefill): every pass costs the
host a whole forward pass, so waiting prompts share as few as they can."""

from __future__ import annotations

import pytest

from kinfer.engines.mlx.attention_ops import SHORT_CONTEXT
from kinfer.engines.mlx.rows import Row, odd_first, plan_prefill
from kinfer.engines.mlx.shape_buckets import bucket, bucket_floor
from tests.engines.driver import job
from tests.engines.mlx.fixtures import *  # noqa: F403 (the `padded` fixture: the buckets on, as on CUDA)

CTX = 512


def rows(*lengths: int, fed: int = 0) -> list[Row]:
    made = []
    for i, length in enumerate(lengths):
        row = Row(i, job(f"j{i}", [1] * length), i, CTX, lambda t: b"")
        row.fed = fed
        made.append(row)
    return made


def test_a_burst_of_similar_prompts_is_one_or_two_padded_passes():
    burst = rows(*(120 + i % 16 for i in range(64)))  # 64 prompts of 120-135 tokens
    passes = plan_prefill(burst, 64 * 135)
    assert len(passes) <= 2  # one per power-of-two bucket of chunk length: here 128 and 256
    planned = [row for p in passes for row in p.rows]
    assert sorted(r.order for r in planned) == list(range(64))  # every row, once
    for p in passes:
        assert all(row.prompt_len - 1 == chunk for row, chunk in zip(p.rows, p.chunks, strict=True))
        assert max(p.chunks) == p.length < 2 * min(p.chunks)  # padding under 2x a row's own chunk


def test_padding_counts_against_the_budget_first_come_first_served():
    burst = rows(100, 101, 102, 103, 104)
    padded, edge = plan_prefill(burst, 350)
    assert [r.order for r in padded.rows] == [0, 1, 2] and padded.length == 101  # 3 x 101 positions
    assert [r.order for r in edge.rows] == [3] and edge.chunks == [350 - 303]  # the rest, unpadded
    assert padded.tokens + edge.tokens == 350


def test_the_first_prompt_always_advances():
    (only,) = plan_prefill(rows(300, 40), 16)
    assert only.chunks == [16] and only.length == 16 and [r.order for r in only.rows] == [0]


def test_padding_never_runs_past_a_rows_context():
    (near_end,) = rows(CTX, fed=CTX - 10)  # 9 prompt tokens left, 10 positions before the row is full
    (long_one,) = rows(CTX, fed=CTX - 17)  # 16 left: the same bucket, padding near_end to 16 would overflow
    passes = plan_prefill([long_one, near_end], 1000)
    assert sorted(c for p in passes for c in p.chunks) == [9, 16]
    for p in passes:
        assert all(row.fed + p.length <= CTX for row in p.rows)


def test_the_row_at_the_budgets_edge_never_takes_more_than_its_prompt_holds():
    # 3 x 128 padded positions leave 80 of the budget: the 20-token row takes its 19, not 80
    # (it overran its prompt before: IndexError on the H200 with 256 rows)
    burst = rows(128, 128, 128, 100, 20)
    passes = plan_prefill(burst, 3 * 127 + 100)
    for p in passes:
        assert all(chunk <= row.prompt_len - 1 - row.fed for row, chunk in zip(p.rows, p.chunks, strict=True))
        assert all(chunk <= p.length for chunk in p.chunks)


def test_on_the_ladder_passes_come_in_a_few_shapes():
    """CUDA (shape_buckets): a padded pass's length is a ladder size, and so is a chunk the budget cuts:
    a matrix product of a new height costs cuBLASLt an algorithm search every time."""
    burst = rows(*(121 + i % 13 for i in range(40)))  # prompts of 121-133 tokens: chunks of 120-132
    passes = plan_prefill(burst, 1000, ladder=True)
    assert 1000 - 16 < sum(p.tokens for p in passes) <= 1000  # a sliver under 16 is left for later
    for p in passes:
        assert p.length == bucket(p.length)  # 128, 144, ...: the ladder
        assert all(chunk <= p.length for chunk in p.chunks)
    (first,) = plan_prefill(rows(513), 300, ladder=True)
    assert first.chunks == [bucket_floor(300)] == [256]  # cut to the ladder (256, 320, ...), not to 300


def test_on_the_ladder_a_long_prompt_takes_its_odd_piece_first_and_full_chunks_after():
    # cut from the front, the odd piece was the last chunk: a padded pass deep in the prompt, a shape no
    # warm-up runs (57-89 ms on the H200 against 32 ms for a full chunk)
    (long_one,) = rows(500)  # 499 tokens to prefill (the last one is the first decode's)
    chunks = []
    while long_one.next_chunk():
        (p,) = plan_prefill([long_one], 256, ladder=True)
        chunks.append((p.chunks[0], p.length))
        long_one.fed += p.chunks[0]
    assert chunks == [(243, 256), (256, 256)]  # the odd piece padded at the front, then a full chunk
    (row,) = rows(500)
    assert odd_first(row.next_chunk(), 128) == 499 % 128  # a paced share: what is left divides by it
    assert odd_first(1024 + 1, 512) == 1 and odd_first(1024, 512) == 512  # nothing odd: a full chunk
    assert plan_prefill(rows(500), 256)[0].chunks == [256]  # off the ladder (CPU): from the front


def test_the_ladder_never_pads_past_a_rows_context():
    (near_end,) = rows(CTX, fed=CTX - 18)  # 17 prompt tokens left, 18 positions: bucket(17) = 20 won't fit
    (only,) = plan_prefill([near_end], 1000, ladder=True)
    assert only.chunks == [17] and near_end.fed + only.length <= CTX


def long_rows(*lengths: int, fed: int) -> list[Row]:
    made = []
    for i, length in enumerate(lengths):
        row = Row(i, job(f"long{i}", [1] * length), i, 40_960, lambda t: b"")
        row.fed = fed
        made.append(row)
    return made


@pytest.mark.usefixtures("padded")
def test_beside_decoding_rows_a_chunk_past_the_short_context_keeps_the_warm_ups_length():
    """CUDA, untimed: a burst's larger share (here 4 x 256) goes to the burst's own prompts; the long
    prompt's chunk stays the one length the warm-up ran at every key bucket, in a pass of its own."""
    (deep,) = long_rows(30_000, fed=SHORT_CONTEXT * 4)
    burst = rows(100, 120, 90)
    passes = plan_prefill([deep, *burst], 1024, ladder=True, long_chunk=256)
    (own,) = [p for p in passes if deep in p.rows]
    assert own.rows == [deep] and own.chunks == [256] and own.length == 256
    assert sorted(r.order for p in passes for r in p.rows if r is not deep) == [0, 1, 2]
    # without it (before) the long row took the odd piece of the burst's share: a length the warm-up
    # never ran past the short context
    before = plan_prefill([deep, *burst], 1024, ladder=True)
    taken = [c for p in before for r, c in zip(p.rows, p.chunks, strict=True) if r is deep]
    assert taken == [odd_first(deep.next_chunk(), 1024)] != [256]


@pytest.mark.usefixtures("padded")
def test_a_long_chunk_is_never_cut_to_fit_the_budgets_edge_and_its_last_piece_is_its_rest():
    (deep,) = long_rows(30_000, fed=20_000)
    first = rows(200)
    (only,) = plan_prefill([*first, deep], 256, ladder=True, long_chunk=256)
    assert only.rows == first  # 56 tokens left: the long row waits a step rather than take a sliver
    (tail,) = long_rows(20_100, fed=20_000)  # 99 tokens to prefill
    (last,) = plan_prefill([tail], 256, ladder=True, long_chunk=256)
    assert last.chunks == [99] and last.length == 99
    (early,) = long_rows(30_000, fed=1_000)  # still inside the short context: the ladder's rules
    (p,) = plan_prefill([early], 1024, ladder=True, long_chunk=256)
    assert p.chunks == [odd_first(30_000 - 1 - 1_000, 1024)]  # 327: not held to 256
