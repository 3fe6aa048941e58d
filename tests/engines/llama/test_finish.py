"""How a llama.cpp row ends: end-of-generation token, stop string, max_tokens, a full row."""

from __future__ import annotations

import pytest

from kinfer.errors import InvalidRequest, PromptTooLong
from tests.engines.llama.fixtures import chat_prompt, job, make_engine, run_alone

__all__ = ["make_engine"]

FRANCE = "What is the capital of France?"


@pytest.fixture
def engine(make_engine):
    return make_engine(rows=2, prefix_cache=False)


def test_the_end_of_generation_token_stops_the_row_and_is_not_in_the_text(engine):
    result = run_alone(engine, job("eos", chat_prompt(engine, FRANCE), max_tokens=64))

    assert (result.finish, result.stop_string) == ("stop", None)
    assert result.text == "The capital of France is Paris."
    assert "<|im_end|>" not in result.text
    assert result.new_tokens < 64  # the reply's tokens and the end-of-generation token


def test_a_stop_string_ends_the_row_is_not_returned_and_is_named(engine):
    prompt = chat_prompt(engine, FRANCE)
    result = run_alone(engine, job("stop", prompt, stop=("Berlin", "Paris", "Rome"), max_tokens=64))

    assert (result.finish, result.stop_string) == ("stop", "Paris")
    assert result.text == "The capital of France is "
    assert result.new_tokens == len(engine.tokenize("The capital of France is Paris"))


def test_a_stop_string_spanning_tokens_is_held_back_until_it_matches(engine):
    prompt = chat_prompt(engine, FRANCE)
    assert len(engine.tokenize(" of France")) > 1
    result = run_alone(engine, job("span", prompt, stop=("l of Fr",), max_tokens=64))

    assert (result.finish, result.text, result.stop_string) == ("stop", "The capita", "l of Fr")
    # "The capita" streamed out before the stop matched; only the "l" that could start it was held
    assert "".join(u.text for u in result.updates[:-1]) == "The capita"
    assert result.updates[-1].text == ""


def test_a_stop_string_that_never_matches_releases_the_held_text_at_the_end(engine):
    result = run_alone(engine, job("tail", chat_prompt(engine, FRANCE), stop=("Paris!",), max_tokens=64))

    assert (result.finish, result.text) == ("stop", "The capital of France is Paris.")
    assert result.stop_string is None  # ended by the end-of-generation token


def test_max_tokens_ends_the_row_with_length(engine):
    result = run_alone(engine, job("short", chat_prompt(engine, FRANCE), max_tokens=3))

    assert (result.finish, result.new_tokens) == ("length", 3)
    assert result.text == "The capital of"


def test_a_row_that_fills_its_context_ends_with_length(make_engine):
    engine = make_engine(rows=1, ctx=256, prefix_cache=False)
    assert engine.info.context_length == 256
    # a long prompt leaves a few dozen cells for the reply
    prompt = chat_prompt(engine, "Continue this story about a dragon: " + "The dragon flew on. " * 38)
    assert 200 < len(prompt) < 256
    result = run_alone(engine, job("full", prompt, max_tokens=10_000, ignore_eos=True))

    assert result.finish == "length"
    # every cell holds a token; the last sampled token is returned but has no cell to go into
    assert len(prompt) + result.new_tokens == 256 + 1
    assert engine.free_rows == 1


def test_a_prompt_longer_than_a_row_is_refused(make_engine):
    engine = make_engine(rows=1, ctx=256, prefix_cache=False)
    too_long = tuple(engine.tokenize("word " * 300))
    with pytest.raises(PromptTooLong):
        engine.submit(job("long", too_long))
    with pytest.raises(InvalidRequest):
        engine.submit(job("empty", ()))
    assert engine.free_rows == 1 and not engine.has_work


def test_max_tokens_zero_only_prefills(engine):
    prompt = chat_prompt(engine, FRANCE)
    result = run_alone(engine, job("warm", prompt, max_tokens=0))

    assert (result.finish, result.new_tokens, result.text) == ("length", 0, "")
    assert result.prompt_processed == len(prompt)
