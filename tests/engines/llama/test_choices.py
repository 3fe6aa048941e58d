"""n choices from one prompt (OpenAI's `n`): the prompt is prefilled once, its KV copied into the
other choices' rows, which then decode side by side, each with its own sampler (seed + i)."""

from __future__ import annotations

import pytest

from kinfer.protocol import Sampling
from tests.engines.llama.fixtures import chat_prompt, job, make_engine, run_alone, run_jobs

__all__ = ["make_engine"]

STORY = "Tell me a story about a cat."
SEEDED = Sampling(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=11)


@pytest.fixture
def engine(make_engine):
    return make_engine(rows=4, prefix_cache=False)


def test_greedy_choices_all_equal_the_single_reply(engine):
    prompt = chat_prompt(engine, STORY)
    alone = run_alone(engine, job("one", prompt, max_tokens=24))

    both = run_jobs(engine, [job("two", prompt, max_tokens=24, choices=2)])

    assert both["two"].text == both["two#1"].text == alone.text
    assert both["two"].finish == both["two#1"].finish == alone.finish


def test_seeded_choices_differ_and_repeat_and_choice_0_is_the_single_reply(engine):
    prompt = chat_prompt(engine, STORY)
    single = run_alone(engine, job("one", prompt, max_tokens=24, sampling=SEEDED))

    first = run_jobs(engine, [job("a", prompt, max_tokens=24, sampling=SEEDED, choices=4)])
    again = run_jobs(engine, [job("b", prompt, max_tokens=24, sampling=SEEDED, choices=4)])

    texts = [first[k].text for k in ("a", "a#1", "a#2", "a#3")]
    assert len(set(texts)) == 4, texts
    assert texts == [again[k].text for k in ("b", "b#1", "b#2", "b#3")]
    assert texts[0] == single.text  # choice 0 draws with the request's own seed


def test_the_prompt_is_prefilled_once_for_all_choices(engine):
    prompt = chat_prompt(engine, STORY)
    before = engine.stats().prompt_tokens_total

    results = run_jobs(engine, [job("a", prompt, max_tokens=8, sampling=SEEDED, choices=4)])

    assert engine.stats().prompt_tokens_total - before == len(prompt)
    assert all(results[k].new_tokens == 8 for k in ("a", "a#1", "a#2", "a#3"))


def test_a_job_takes_a_row_per_choice_and_gives_them_all_back(engine):
    prompt = chat_prompt(engine, STORY)
    engine.submit(job("a", prompt, max_tokens=8, choices=3))

    assert engine.free_rows == 1  # held for the other choices while the prompt prefills
    engine.step()
    assert engine.stats().rows_busy == 3
    while engine.has_work:
        engine.step()
    assert engine.free_rows == 4


def test_cancelling_during_prefill_ends_every_choice(engine):
    prompt = chat_prompt(engine, STORY * 20)
    engine.submit(job("a", prompt, max_tokens=8, choices=3))
    engine.cancel("a")

    updates = []
    while engine.has_work:
        updates += engine.step()

    assert sorted((u.choice, u.finish) for u in updates) == [
        (0, "cancelled"),
        (1, "cancelled"),
        (2, "cancelled"),
    ]
    assert engine.free_rows == 4


def test_cancelling_while_decoding_ends_every_choice(engine):
    prompt = chat_prompt(engine, STORY)
    engine.submit(job("a", prompt, max_tokens=64, sampling=SEEDED, choices=4))
    for _ in range(3):
        engine.step()
    assert engine.free_rows == 0

    engine.cancel("a")
    finishes = [u for u in engine.step() if u.finish is not None]

    assert sorted(u.choice for u in finishes) == [0, 1, 2, 3]
    assert {u.finish for u in finishes} == {"cancelled"}
    assert engine.free_rows == 4 and not engine.has_work


def logprob_records(result) -> list[tuple[int, float, list[int]]]:
    return [
        (lp.token.id, lp.token.logprob, [t.id for t in lp.top]) for u in result.updates for lp in u.logprobs
    ]


def test_each_choice_is_biased_once_and_reports_its_own_logprobs(engine):
    # every choice draws its first token from the prompt's logits; a draw writes its bias into them, so
    # each choice must start from the model's own logits again (a bias added twice would show here)
    prompt = chat_prompt(engine, STORY)
    favoured = engine.tokenize(" dragon")[-1]
    sampling = Sampling(temperature=0.0, logit_bias=((favoured, 4.0),), logprobs=2)
    single = run_alone(engine, job("one", prompt, max_tokens=6, sampling=sampling))

    both = run_jobs(engine, [job("two", prompt, max_tokens=6, sampling=sampling, choices=3)])

    expected = logprob_records(single)
    assert len(expected) >= 1
    for key in ("two", "two#1", "two#2"):
        assert both[key].text == single.text
        got = logprob_records(both[key])
        assert [(t, top) for t, _, top in got] == [(t, top) for t, _, top in expected]
        assert [lp for _, lp, _ in got] == pytest.approx([lp for _, lp, _ in expected], abs=1e-4)
