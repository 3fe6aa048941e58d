"""Per-row sampling with llama.cpp's sampler chain: seeded draws are reproducible, each row keeps its
own chain, and the chain's stages (penalties, top-k, temperature) act in llama.cpp's order."""

from __future__ import annotations

import pytest

from kinfer.protocol import Sampling
from tests.engines.llama.fixtures import chat_prompt, job, make_engine, run_alone, run_jobs

__all__ = ["make_engine"]

STORY = "Tell me a story."


@pytest.fixture
def engine(make_engine):
    return make_engine(rows=2, prefix_cache=False)


def test_a_seed_makes_sampling_reproducible_alone_and_batched(engine):
    prompt = chat_prompt(engine, STORY)
    seeded = Sampling(temperature=0.9, seed=7)

    first = run_alone(engine, job("a", prompt, sampling=seeded))
    second = run_alone(engine, job("b", prompt, sampling=seeded))
    together = run_jobs(engine, [job("c", prompt, sampling=seeded), job("d", prompt, sampling=seeded)])

    assert first.text == second.text
    # each row draws from its own chain: a neighbour with the same seed does not disturb it
    assert together["c"].text == together["d"].text == first.text


def test_temperature_above_zero_differs_from_greedy_for_some_seed(engine):
    prompt = chat_prompt(engine, STORY)
    greedy = run_alone(engine, job("g", prompt)).text

    sampled = {
        run_alone(engine, job(f"s{seed}", prompt, sampling=Sampling(temperature=0.9, seed=seed))).text
        for seed in range(4)
    }

    assert any(text != greedy for text in sampled)
    assert len(sampled) > 1, "different seeds draw differently"


def test_top_k_of_one_leaves_only_the_greedy_token(engine):
    prompt = chat_prompt(engine, STORY)
    greedy = run_alone(engine, job("g", prompt)).text

    top1 = run_alone(engine, job("k", prompt, sampling=Sampling(temperature=1.5, top_k=1, seed=3)))

    assert top1.text == greedy


def test_a_repeat_penalty_steers_greedy_decoding_away_from_repeats(engine):
    prompt = chat_prompt(engine, "Count from 1 to 10.")
    plain = run_alone(engine, job("plain", prompt, max_tokens=24))
    penalised = run_alone(
        engine, job("pen", prompt, max_tokens=24, sampling=Sampling(temperature=0.0, repeat_penalty=1.5))
    )

    assert penalised.text != plain.text
