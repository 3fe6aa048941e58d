"""How many prompt tokens a step takes beside decoding rows (engines/prefill_budget.py): the measured
prefill speed sizes the chunk so the step fits its time budget."""

from __future__ import annotations

import pytest

from kinfer.engines.prefill_budget import (
    AUTO_FLOOR_CPU_S,
    AUTO_FLOOR_GPU_S,
    BURST_MAX,
    FIRST_CHUNK,
    MIN_CHUNK,
    UNTIMED_BESIDE_DECODE,
    UNTIMED_BURST_MAX,
    PrefillBudget,
    StepClock,
    burst_factor,
)


def test_without_decoding_rows_the_engines_own_cap_applies():
    budget = PrefillBudget(step_ms=100, max_tokens=2048)
    budget.prefilled(100, 1.0)  # slow: 10 ms a token
    assert budget.room(2048, decoding=False) == 2048


def test_before_any_measurement_a_small_first_chunk():
    assert PrefillBudget(step_ms=100, max_tokens=2048).room(2048, decoding=True) == FIRST_CHUNK


def test_the_chunk_fills_what_the_decode_pass_leaves_of_the_budget():
    budget = PrefillBudget(step_ms=200, max_tokens=2048, last_chunk=1000)
    budget.prefilled(100, 0.1)  # 1 ms a token
    assert budget.room(2048, decoding=True, spent_s=0.05) == 150  # 150 ms left


def test_a_chunk_at_most_doubles_from_one_step_to_the_next():
    budget = PrefillBudget(step_ms=1000, max_tokens=2048)
    budget.prefilled(FIRST_CHUNK, FIRST_CHUNK * 0.0001)  # fast: the budget would allow ~10,000
    sizes = []
    for _ in range(5):
        sizes.append(budget.room(2048, decoding=True, spent_s=0.0))
        budget.took(sizes[-1])
    assert sizes == [2 * FIRST_CHUNK, 4 * FIRST_CHUNK, 8 * FIRST_CHUNK, 16 * FIRST_CHUNK, 32 * FIRST_CHUNK]


def test_the_prompt_advances_even_when_decoding_alone_fills_the_budget():
    budget = PrefillBudget(step_ms=50, max_tokens=2048)
    budget.prefilled(100, 0.1)
    assert budget.room(2048, decoding=True, spent_s=0.2) == MIN_CHUNK
    # ... but a second prompt in the same step waits for the next one
    assert budget.room(2048, decoding=True, taken=MIN_CHUNK, spent_s=0.25) == 0


def test_the_speed_follows_a_prompt_that_grows_slower():
    budget = PrefillBudget(step_ms=100, max_tokens=4096, last_chunk=4096)
    budget.prefilled(100, 0.1)
    first = budget.room(4096, decoding=True, spent_s=0.0)
    for _ in range(6):  # attention over a longer prompt: each token costs twice as much
        budget.prefilled(100, 0.2)
    later = budget.room(4096, decoding=True, spent_s=0.0)
    assert first == 100 and later == pytest.approx(50, abs=2)


@pytest.mark.parametrize(
    ("gpu", "decode_s", "target_s"),
    [(True, 0.004, AUTO_FLOOR_GPU_S), (True, 0.1, 0.25), (False, 0.06, AUTO_FLOOR_CPU_S), (False, 0.2, 0.5)],
)
def test_the_automatic_budget_is_a_few_decode_steps_never_under_the_devices_floor(gpu, decode_s, target_s):
    budget = PrefillBudget.on(0, 2048, gpu=gpu)
    budget.decoded(decode_s)
    assert budget.target_s == pytest.approx(target_s)


def test_an_explicit_budget_is_taken_as_given():
    budget = PrefillBudget.on(80, 2048, gpu=False)
    budget.decoded(1.0)
    assert budget.target_s == pytest.approx(0.08)


def test_a_step_clock_charges_a_steps_time_past_its_decode_to_the_prompt_tokens_it_dispatched():
    budget = PrefillBudget(step_ms=100, max_tokens=2048)
    clock = StepClock(budget)
    clock.ended(0.0, read_back=False, prefill=0)  # the first step: nothing to read back yet
    clock.ended(0.02, read_back=True, prefill=0)  # decode only: 20 ms
    clock.ended(0.04, read_back=True, prefill=50)
    clock.ended(0.14, read_back=True, prefill=0)  # the step with 50 prompt tokens took 100 ms
    assert budget.decode_s == pytest.approx(0.02)
    assert budget.per_token_s == pytest.approx((0.1 - 0.02) / 50)
    clock.ended(5.0, read_back=False, prefill=0)  # idle in between: nothing is charged
    assert budget.decode_s == pytest.approx(0.02)


def test_a_prompts_small_tail_does_not_start_the_next_burst_from_a_few_tokens():
    budget = PrefillBudget(step_ms=1000, max_tokens=4096, last_chunk=1024)
    budget.prefilled(1024, 0.01)  # fast
    budget.took(3, room=2048)  # only a 3-token tail waited: the step took less than its room
    assert budget.room(4096, decoding=True, spent_s=0.0) == 2048  # still doubles from 1024
    budget.took(2048, room=2048)
    budget.took(100, room=100)  # a step the budget itself cut short does shrink the base
    assert budget.room(4096, decoding=True, spent_s=0.0) == 200


def test_a_step_clock_does_not_plan_by_a_small_tails_pass():
    budget = PrefillBudget(step_ms=100, max_tokens=2048, last_chunk=512)
    clock = StepClock(budget)
    clock.ended(0.0, read_back=False, prefill=0)
    clock.ended(0.02, read_back=True, prefill=512)
    clock.ended(0.07, read_back=True, prefill=2)  # 512 tokens in 30 ms past the decode
    clock.ended(0.10, read_back=True, prefill=0)  # 2 tokens in 10 ms: a pass's fixed cost, no speed
    assert budget.per_token_s == pytest.approx(0.03 / 512)


@pytest.mark.parametrize(
    ("waiting", "decoding", "factor"),
    [(1, 16, 1.0), (16, 16, 1.0), (48, 16, 3.0), (63, 1, BURST_MAX), (5, 0, 1.0)],
)
def test_a_burst_of_waiting_prompts_stretches_the_step_target_boundedly(waiting, decoding, factor):
    assert burst_factor(waiting, decoding) == factor
    budget = PrefillBudget(step_ms=100, max_tokens=1 << 20, last_chunk=1 << 20)
    budget.prefilled(1000, 0.01)  # 10 us a token
    room = budget.room(1 << 20, decoding=True, spent_s=0.02, burst=burst_factor(waiting, decoding))
    assert room == pytest.approx((0.1 * factor - 0.02) / 1e-5, rel=1e-3)


@pytest.mark.parametrize(
    ("waiting", "decoding", "factor"),
    [(1, 16, 1.0), (2, 200, 1.0), (8, 200, 4.0), (120, 136, UNTIMED_BURST_MAX), (5, 0, 1.0)],
)
def test_untimed_a_burst_is_counted_in_waiting_prompts_not_against_decoding_rows(waiting, decoding, factor):
    # the second half of a 256-stream burst waits beside the first half decoding: still a burst
    untimed = PrefillBudget.on(0, 2048, gpu=True, timed=False)
    assert untimed.burst(waiting, decoding) == factor
    timed = PrefillBudget.on(0, 2048, gpu=True, timed=True)
    assert timed.burst(waiting, decoding) == burst_factor(waiting, decoding)


def test_an_untimed_budget_takes_a_fixed_share_every_step_unless_a_step_time_is_set():
    # MLX on CUDA: learned chunks made 64 prompts of 128 tokens wait 21-60 s for a first token on the
    # H200 where the cap alone took 1 s; beside decoding rows, the cap made 0.39 s gaps (prefill_budget.py)
    untimed = PrefillBudget.on(0, 2048, gpu=True, timed=False)
    untimed.prefilled(8, 0.01)
    untimed.decoded(0.01)
    assert untimed.room(2048, decoding=False) == 2048  # nobody streams: the whole cap
    assert untimed.room(2048, decoding=True) == UNTIMED_BESIDE_DECODE  # a long prompt beside streams
    assert untimed.room(2048, decoding=True, burst=untimed.burst(8, 4)) == 4 * UNTIMED_BESIDE_DECODE
    # a burst of 256 beside a few decoding rows: up to the whole cap (a prefill step's host cost on the
    # H200 barely grows with its tokens, so fewer and larger steps bring the first tokens sooner)
    assert untimed.burst_limit == UNTIMED_BURST_MAX == 8
    assert untimed.room(2048, decoding=True, burst=untimed.burst(240, 16)) == 2048
    assert untimed.room(2048, decoding=True, taken=200) == UNTIMED_BESIDE_DECODE - 200
    assert PrefillBudget.on(0, 2048, gpu=True, timed=True).room(2048, decoding=True) == FIRST_CHUNK
    explicit = PrefillBudget.on(50, 2048, gpu=True, timed=False)  # the setting wins
    assert explicit.room(2048, decoding=True) == FIRST_CHUNK


def test_a_prefill_step_quicker_than_the_decode_estimate_still_teaches_the_speed():
    budget = PrefillBudget(step_ms=100, max_tokens=2048)
    clock = StepClock(budget)
    clock.ended(0.0, read_back=False, prefill=0)
    clock.ended(0.05, read_back=True, prefill=FIRST_CHUNK)  # a slow decode-only step: 50 ms
    clock.ended(0.09, read_back=True, prefill=0)  # the chunk's step took 40 ms: "less than nothing"
    assert budget.per_token_s is not None and budget.per_token_s < 1e-6
    assert budget.room(2048, decoding=True) == 2 * FIRST_CHUNK  # grows at once
