"""Text in and out of the llama.cpp engine: tokenize/detokenize, streaming of multi-byte characters,
and what the engine says about the model and itself."""

from __future__ import annotations

import os

import pytest

from tests.engines.llama.fixtures import chat_prompt, job, make_engine, run_alone

__all__ = ["make_engine"]

IM_START, IM_END = 1, 2  # SmolLM2's ChatML control tokens


@pytest.fixture
def engine(make_engine):
    return make_engine(rows=2, prefix_cache=False)


@pytest.mark.parametrize(
    "text",
    [
        "Hello, world!",
        "Café 東京 🙂 naïve — digits 1234567890",
        "tabs\tand\nnewlines\n\n  indented",
        "<|im_start|>user\nWhat's 2+2?<|im_end|>\n<|im_start|>assistant\n",
    ],
)
def test_detokenize_round_trips_tokenize(engine, text):
    assert engine.detokenize(engine.tokenize(text)) == text


def test_chatml_special_tokens_are_parsed_as_single_tokens(engine):
    tokens = engine.tokenize("<|im_start|>user\nHi<|im_end|>\n")

    assert tokens[0] == IM_START and IM_END in tokens
    assert len(tokens) < 8
    assert engine.detokenize([IM_START]) == "<|im_start|>"


def test_bos_is_not_added_when_the_model_does_not_ask_for_it(engine):
    # SmolLM2's GGUF says add_bos_token = false (its "BOS" is <|im_start|>)
    assert engine.tokenize("Hello")[0] != IM_START
    assert engine.tokenize("<|im_start|>Hello").count(IM_START) == 1


def test_multibyte_characters_split_across_tokens_stream_out_whole(engine):
    assert len(engine.tokenize("🌟")) == 3, "the star emoji is three byte tokens"

    result = run_alone(engine, job("emoji", chat_prompt(engine, "Say an emoji."), max_tokens=9))

    assert result.text == "🌟🌟🌟"
    assert [u.text for u in result.updates] == ["", "", "🌟"] * 3
    assert all(u.new_tokens == 1 for u in result.updates)


@pytest.mark.parametrize("max_tokens", range(1, 9))
def test_a_reply_cut_inside_a_character_ends_without_a_replacement_character(engine, max_tokens):
    result = run_alone(engine, job("cut", chat_prompt(engine, "Say an emoji."), max_tokens=max_tokens))

    assert result.finish == "length"
    assert "\ufffd" not in result.text
    assert result.text == "🌟" * (max_tokens // 3)  # only whole stars: a star is three byte tokens


def test_model_info_comes_from_the_gguf(engine):
    info = engine.info

    assert (info.name, info.engine, info.architecture) == ("smollm2", "llama.cpp", "llama")
    assert info.chat_template and "<|im_start|>" in info.chat_template
    assert (info.bos_token, info.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert (info.context_length, info.rows, info.recurrent) == (1024, 2, False)
    assert info.train_context_length == 8192


def test_stats_count_steps_tokens_and_memory(engine):
    prompt = chat_prompt(engine, "What is the capital of France?")
    result = run_alone(engine, job("s", prompt, max_tokens=4))

    stats = engine.stats()
    assert (stats.rows_total, stats.rows_busy) == (2, 0)
    assert stats.prompt_tokens_total == len(prompt)
    assert stats.generated_tokens_total == result.new_tokens == 4
    assert stats.steps_total == 4  # the prompt's step samples the first token
    assert stats.tokens_last_step == 1
    # two rows x 1024 tokens x 30 layers x 3 KV heads x (64 + 64) dims x 2 bytes
    assert stats.memory["kv"] == 2 * 1024 * 30 * 3 * 128 * 2
    assert stats.memory["weights"] > 50_000_000


def test_automatic_sizing_on_the_cpu(make_engine):
    engine = make_engine(rows=0, ctx=0, threads=0)

    assert engine.info.rows == 4
    assert engine.info.context_length == 4096  # min(train context 8192, 4096)
    assert engine.plan.pool_slots == 4
    assert engine.plan.threads == len(os.sched_getaffinity(0))
