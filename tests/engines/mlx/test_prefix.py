"""The MLX engine's prefix pool: a prompt that shares a prefix with a recent one skips it.

Attention models adopt any shared prefix (their KV is cut to it); recurrent models (qwen3_5's
GatedDeltaNet layers) adopt only exact checkpoints saved at the positions the scheduler names: the end
of the system prompt and the end of the conversation so far. Either way the reply is exactly the cold one.
"""

from __future__ import annotations

import pytest

from tests.engines.mlx.fixtures import *  # noqa: F403
from tests.engines.mlx.fixtures import chat, job, readable, run_alone

SYSTEM = (
    "You are a careful assistant for a small bakery in Lyon. You answer questions about bread, pastries, "
    "opening hours and prices. Keep answers short and friendly, and never invent prices that are not listed."
)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_an_agents_next_turn_reuses_the_previous_turn(arch, tiny_models, make_mlx):
    path = tiny_models[arch]
    warm = make_mlx(path)
    cold = make_mlx(path, prefix_cache=False)
    first_prompt = warm.tokenize(chat("When do you open?", system=SYSTEM))
    first = run_alone(warm, job("t1", first_prompt, max_tokens=12))
    assert first.reused_tokens == 0

    # the next turn: the whole first exchange, then a new question
    history = warm.detokenize(first_prompt) + first.text + "<|im_end|>\n"
    second_prompt = warm.tokenize(chat("And on Sunday?", history=history))
    second = run_alone(warm, job("t2", second_prompt, max_tokens=12))

    assert second.reused_tokens >= len(first_prompt)
    assert second.text == run_alone(cold, job("t2", second_prompt, max_tokens=12)).text
    stats = warm.stats()
    assert stats.prefix_hits >= 1 and stats.reused_tokens_total == second.reused_tokens


def test_a_new_conversation_reuses_the_shared_system_prompt(tiny_qwen3, make_mlx):
    warm = make_mlx(tiny_qwen3)
    cold = make_mlx(tiny_qwen3, prefix_cache=False)
    one = warm.tokenize(chat("When do you open?", system=SYSTEM))
    two = warm.tokenize(chat("Do you sell croissants?", system=SYSTEM))
    shared = next(i for i, (a, b) in enumerate(zip(one, two, strict=False)) if a != b)

    run_alone(warm, job("one", one, max_tokens=6))
    result = run_alone(warm, job("two", two, max_tokens=10))

    assert result.reused_tokens == shared  # cut to the prefix the two prompts share
    assert result.text == run_alone(cold, job("two", two, max_tokens=10)).text


def test_a_recurrent_model_adopts_exact_checkpoints_only(tiny_qwen35, make_mlx):
    warm = make_mlx(tiny_qwen35)
    cold = make_mlx(tiny_qwen35, prefix_cache=False)
    system_end = len(warm.tokenize(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"))
    one = warm.tokenize(chat("When do you open?", system=SYSTEM))
    two = warm.tokenize(chat("Do you sell croissants?", system=SYSTEM))
    assert one[:system_end] == two[:system_end] and one[system_end] == two[system_end]  # shares more

    first = run_alone(warm, job("one", one, max_tokens=6, checkpoints=(system_end,)))
    second = run_alone(warm, job("two", two, max_tokens=10, checkpoints=(system_end,)))

    assert first.reused_tokens == 0
    # the prompts share a little past the system prompt, but state exists only at the checkpoint
    assert second.reused_tokens == system_end
    assert readable(second.text) == readable(run_alone(cold, job("two", two, max_tokens=10)).text)


def test_a_recurrent_models_next_turn_reuses_the_conversation_checkpoint(tiny_qwen35, make_mlx):
    warm = make_mlx(tiny_qwen35)
    cold = make_mlx(tiny_qwen35, prefix_cache=False)
    first_prompt = warm.tokenize(chat("When do you open?", system=SYSTEM))
    first = run_alone(warm, job("t1", first_prompt, max_tokens=8))
    history = warm.detokenize(first_prompt) + first.text + "<|im_end|>\n"
    # the scheduler's checkpoint: the end of the conversation before the newest turn
    conversation_end = len(warm.tokenize(history))
    second_prompt = warm.tokenize(chat("And on Sunday?", history=history))
    third_history = warm.detokenize(second_prompt) + "We open at nine.<|im_end|>\n"
    third_prompt = warm.tokenize(chat("Thanks!", history=third_history))

    run_alone(warm, job("t2", second_prompt, max_tokens=8, checkpoints=(conversation_end,)))
    # a retry of turn two (say, regenerate) adopts the checkpoint saved while turn two was prefilled
    retry = run_alone(warm, job("t2b", second_prompt, max_tokens=8))
    later = run_alone(warm, job("t3", third_prompt, max_tokens=8))

    assert retry.reused_tokens == conversation_end
    assert readable(retry.text) == readable(run_alone(cold, job("t2b", second_prompt, max_tokens=8)).text)
    assert later.reused_tokens >= conversation_end
    assert readable(later.text) == readable(run_alone(cold, job("t3", third_prompt, max_tokens=8)).text)


def test_prefix_cache_off_never_reuses(tiny_qwen3, make_mlx):
    engine = make_mlx(tiny_qwen3, prefix_cache=False)
    prompt = engine.tokenize(chat("When do you open?", system=SYSTEM))
    run_alone(engine, job("a", prompt, max_tokens=4))
    assert run_alone(engine, job("b", prompt, max_tokens=4)).reused_tokens == 0
    assert engine.stats().prefix_lookups == 0


def test_pool_entries_give_their_blocks_back(tiny_qwen3, make_mlx):
    """Many different prompts: the pool keeps a bounded number of entries and KV stays bounded."""
    engine = make_mlx(tiny_qwen3, rows=2, ctx=256)
    for i in range(30):
        prompt = engine.tokenize(chat(f"Question number {i}: " + "why? " * (i % 7), system=SYSTEM))
        run_alone(engine, job(f"q{i}", prompt, max_tokens=3))
    memory = engine.stats().memory
    assert memory["kv_blocks_total"] <= engine.plan.max_blocks
    assert memory["kv_blocks_used"] <= memory["kv_blocks_total"]
    assert len(engine._pool) <= engine.plan.pool_entries
