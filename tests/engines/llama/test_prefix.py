"""The prefix pool: recent prompts kept in spare sequence ids, adopted by a KV copy (no recompute)."""

from __future__ import annotations

from kinfer.engines.llama.prefix import LEAST_REUSE_TOKENS, MIN_REUSE_TOKENS, reuse_threshold
from kinfer.engines.prefix_index import common_prefix_length
from tests.engines.llama.fixtures import SYSTEM, chat_prompt, job, make_engine, run_alone, two_turns

__all__ = ["make_engine"]


def test_a_prompt_adopted_from_the_pool_gives_the_same_tokens_as_a_cold_run(make_engine):
    engine = make_engine(rows=2)
    cold = make_engine(rows=1, prefix_cache=False)
    first = chat_prompt(engine, "When do you open?", system=SYSTEM)
    second = chat_prompt(engine, "Do you sell croissants?", system=SYSTEM)
    shared = common_prefix_length(first, second)
    assert shared > 32

    assert run_alone(engine, job("t1", first)).reused_tokens == 0
    warm = run_alone(engine, job("t2", second, max_tokens=24))

    assert warm.reused_tokens == shared
    assert warm.prompt_processed == len(second)
    assert warm.text == run_alone(cold, job("c2", second, max_tokens=24)).text
    stats = engine.stats()
    assert (stats.prefix_lookups, stats.prefix_hits, stats.reused_tokens_total) == (2, 1, shared)
    assert stats.prompt_tokens_total == len(first) + len(second) - shared


def test_the_next_turn_of_a_conversation_adopts_the_prompt_and_the_reply(make_engine):
    engine = make_engine(rows=2)
    turn1, turn2 = two_turns(engine)
    assert turn2[: len(turn1)] == turn1

    warm = run_alone(engine, job("t2", turn2, max_tokens=24))

    # Only the reuse is checked here: that the warm turn matches its cold run to the bit needs the
    # batch-invariant flash attention (test_flash_attention.py); the plain kernels write a decoded
    # token's cells otherwise than a prefill of it, equal up to rounding.
    assert warm.reused_tokens > len(turn1), "the reply's tokens were reused too"
    assert warm.prompt_processed == len(turn2)
    assert warm.finish in ("stop", "length") and warm.text


def test_a_prompt_never_leaves_a_lone_token_to_prefill(make_engine):
    prompt = chat_prompt(make_engine(rows=1, prefix_cache=False), "Do you sell croissants?", system=SYSTEM)
    cold = run_alone(make_engine(rows=1, prefix_cache=False), job("cold", prompt, max_tokens=24))
    # a budget one short of the prompt would leave its last token for a step of its own
    chunked = make_engine(rows=1, prefix_cache=False, step_tokens=len(prompt) - 1)

    result = run_alone(chunked, job("chunked", prompt, max_tokens=24))

    processed = [u.prompt_processed for u in result.updates]
    assert processed[:2] == [len(prompt) - 2, len(prompt)]
    assert result.text == cold.text


def test_exact_prefix_mode_adopts_only_whole_checkpoints(make_engine):
    # what recurrent models get: state cannot be cut back, so only exact saved points are adopted
    engine = make_engine(rows=2, exact_prefix=True)  # two pool slots: the checkpoint and the reply
    cold = make_engine(rows=1, prefix_cache=False)
    system = tuple(engine.tokenize(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"))
    first = chat_prompt(engine, "When do you open?", system=SYSTEM)
    second = chat_prompt(engine, "Do you sell croissants?", system=SYSTEM)
    assert first[: len(system)] == system and common_prefix_length(first, second) > len(system)

    one = run_alone(engine, job("t1", first, checkpoints=(len(system),)))

    assert len(system) in [u.prompt_processed for u in one.updates], "prefill paused at the checkpoint"
    assert system in engine.pool_entries()
    warm = run_alone(engine, job("t2", second, max_tokens=24))
    assert warm.reused_tokens == len(system)
    assert warm.text == run_alone(cold, job("c2", second, max_tokens=24)).text


def test_checkpoints_a_token_apart_are_each_saved(make_engine):
    engine = make_engine(rows=2, exact_prefix=True)
    prompt = chat_prompt(engine, "When do you open?", system=SYSTEM)
    cut = len(prompt) // 2

    result = run_alone(engine, job("t", prompt, max_tokens=2, checkpoints=(cut, cut + 1)))

    processed = [u.prompt_processed for u in result.updates]
    assert processed[:3] == [cut, cut + 1, len(prompt)]
    assert prompt[: cut + 1] in engine.pool_entries()


def test_the_pool_evicts_the_least_recently_used_prompt(make_engine):
    engine = make_engine(rows=2)  # two pool slots
    topics = ["volcanoes", "the history of the printing press", "deep sea octopus behaviour"]
    prompts = {
        t: chat_prompt(engine, f"Write three paragraphs about {t}.", system=f"{t.title()}: you know it. " * 6)
        for t in topics
    }
    a, b, c = (prompts[t] for t in topics)
    # too little in common to adopt from each other, however cheap a copy is
    assert all(common_prefix_length(x, y) < LEAST_REUSE_TOKENS for x, y in [(a, b), (a, c), (b, c)])

    for key, prompt in [("a", a), ("b", b)]:
        run_alone(engine, job(key, prompt, max_tokens=2))
    # the same prompt again: all but its last two tokens come from the pool (two are evaluated so that
    # no token is ever alone in a micro-batch, which would change the numbers)
    assert run_alone(engine, job("a-again", a, max_tokens=2)).reused_tokens == len(a) - 2
    run_alone(engine, job("c", c, max_tokens=2))  # evicts b, now the least recently used

    assert run_alone(engine, job("b-again", b, max_tokens=2)).reused_tokens == 0
    assert len(engine.pool_entries()) == 2


def test_with_the_prefix_cache_off_nothing_is_saved_or_reused(make_engine):
    engine = make_engine(rows=2, prefix_cache=False)
    prompt = chat_prompt(engine, "When do you open?", system=SYSTEM)
    run_alone(engine, job("t1", prompt))

    again = run_alone(engine, job("t2", prompt))

    assert again.reused_tokens == 0
    assert engine.pool_entries() == []
    stats = engine.stats()
    assert (stats.prefix_lookups, stats.prefix_hits) == (0, 0)
    assert engine.plan.pool_slots == 0


def test_a_short_shared_preamble_is_adopted_once_prefill_has_been_timed(make_engine):
    # SmolLM2's template opens every chat with the same system turn: 24 tokens, two more with the
    # user's turn. Copying a row's KV stream (a few hundred cells here) is far cheaper on a CPU than
    # prefilling 26 tokens, so once a prompt chunk has been timed the preamble is adopted.
    engine = make_engine(rows=2, ctx=512)
    cold = make_engine(rows=1, prefix_cache=False, ctx=512)
    preamble = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    first = chat_prompt(engine, "When do you open?", system=preamble)
    second = chat_prompt(engine, "Do you sell croissants?", system=preamble)
    shared = common_prefix_length(first, second)
    assert LEAST_REUSE_TOKENS <= shared < MIN_REUSE_TOKENS

    assert run_alone(engine, job("t1", first)).reused_tokens == 0  # nothing timed, nothing saved yet
    warm = run_alone(engine, job("t2", second, max_tokens=24))

    assert warm.reused_tokens == shared
    assert warm.text == run_alone(cold, job("c2", second, max_tokens=24)).text


def test_adopting_needs_as_many_shared_tokens_as_the_stream_copy_costs_in_prefill():
    mib = 2**20
    assert reuse_threshold(10 * mib, None, gpu=False) == MIN_REUSE_TOKENS  # no prefill timed yet
    # 10 MiB at 5 GB/s: ~2 ms, under one token at 4 ms a token
    assert reuse_threshold(10 * mib, 0.004, gpu=False) == LEAST_REUSE_TOKENS
    # a 32,768-cell stream of SmolLM2 (~750 MiB): ~157 ms, 40 tokens' prefill
    assert reuse_threshold(750 * mib, 0.004, gpu=False) == 40
    # a GPU copies a stream far faster than a CPU, and prefills far faster too
    assert reuse_threshold(750 * mib, 0.0001, gpu=True) == 40
    assert reuse_threshold(750 * mib, 0.001, gpu=True) == LEAST_REUSE_TOKENS
