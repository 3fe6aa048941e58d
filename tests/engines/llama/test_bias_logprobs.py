"""logit_bias and logprobs on the llama.cpp engine: a bias is added to the row's own logits before its
sampler chain (-100 bans, +100 forces); logprobs are the log-softmax of those logits (after bias and
mask, before penalties and temperature), and match an independent solo scoring of the reply."""

from __future__ import annotations

import numpy as np
import pytest

from kinfer.errors import InvalidRequest
from kinfer.protocol import Sampling
from tests.engines.llama.fixtures import chat_prompt, job, make_engine, run_alone, run_jobs

__all__ = ["make_engine"]

QUESTION = "What is the capital of France?"


@pytest.fixture
def engine(make_engine):
    return make_engine(rows=4, prefix_cache=False)


def token_ids(result) -> list[int]:
    return [lp.token.id for update in result.updates for lp in update.logprobs]


def test_a_banned_token_never_appears_in_sampled_replies(engine):
    prompt = chat_prompt(engine, QUESTION)
    greedy = run_alone(engine, job("g", prompt, max_tokens=4, sampling=Sampling(temperature=0.0, logprobs=0)))
    banned = token_ids(greedy)[0]  # the token the model wants most at the start
    sampling = Sampling(temperature=1.0, logit_bias=((banned, -100.0),), logprobs=0)

    results = run_jobs(engine, [job(f"s{i}", prompt, max_tokens=4, sampling=sampling) for i in range(12)])

    drawn = [t for r in results.values() for t in token_ids(r)]
    assert drawn and banned not in drawn


def test_a_forced_token_is_every_token_while_free_neighbours_keep_their_text(engine):
    prompt = chat_prompt(engine, QUESTION)
    forced = engine.tokenize(" banana")[-1]
    free_alone = run_alone(engine, job("alone", prompt, max_tokens=8)).text

    results = run_jobs(
        engine,
        [
            job(
                "forced",
                prompt,
                max_tokens=8,
                sampling=Sampling(temperature=0.8, logit_bias=((forced, 100.0),), logprobs=0),
            ),
            job("free", prompt, max_tokens=8),
        ],
    )

    assert token_ids(results["forced"]) == [forced] * 8
    assert results["free"].text == free_alone


def test_greedy_logprobs_choose_the_top_token_and_batched_rows_match_their_solo_run(engine):
    prompt = chat_prompt(engine, QUESTION)
    sampling = Sampling(temperature=0.0, logprobs=5)
    alone = run_alone(engine, job("solo", prompt, max_tokens=12, sampling=sampling))
    results = run_jobs(
        engine,
        [job(f"r{i}", prompt, max_tokens=12, sampling=sampling) for i in range(3)] + [job("free", prompt)],
    )
    records = [lp for update in results["r1"].updates for lp in update.logprobs]

    assert records
    for lp in records:
        assert len(lp.top) == 5
        assert lp.top[0].id == lp.token.id and lp.top[0].logprob == lp.token.logprob
        assert [t.logprob for t in lp.top] == sorted((t.logprob for t in lp.top), reverse=True)
    solo = [lp.token.logprob for update in alone.updates for lp in update.logprobs]
    assert sum(lp.token.logprob for lp in records) == pytest.approx(sum(solo), abs=1e-3)
    assert all(not u.logprobs for u in results["free"].updates)  # a row that did not ask gets none


def test_logprobs_sum_to_an_independent_scoring_of_the_reply(make_engine, smollm_f32):
    """Float32 weights: llama.cpp's one-token decode and its batched prompt pass agree closely there
    (on the Q4_1 GGUF they differ by up to ~1e-2 per token, whoever computes the softmax)."""
    from llama_cpp import Llama

    engine = make_engine(path=smollm_f32.gguf, rows=2, prefix_cache=False)
    prompt = chat_prompt(engine, QUESTION)
    result = run_alone(
        engine, job("r", prompt, max_tokens=12, sampling=Sampling(temperature=0.0, logprobs=1))
    )
    records = [lp for update in result.updates for lp in update.logprobs]
    reply = [lp.token.id for lp in records]

    solo = Llama(str(smollm_f32.gguf), n_ctx=512, logits_all=True, n_threads=1, verbose=False)
    try:
        solo.eval(list(prompt) + reply)
        scores = np.asarray(solo.scores[len(prompt) - 1 : len(prompt) - 1 + len(reply)], dtype=np.float64)
    finally:
        solo.close()
    shifted = scores - scores.max(axis=1, keepdims=True)
    expected = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    want = sum(expected[i, t] for i, t in enumerate(reply))
    assert len(reply) >= 4
    assert sum(lp.token.logprob for lp in records) == pytest.approx(want, abs=1e-3)


def test_logprobs_are_taken_after_the_bias(engine):
    prompt = chat_prompt(engine, QUESTION)
    plain = run_alone(engine, job("p", prompt, max_tokens=1, sampling=Sampling(temperature=0.0, logprobs=2)))
    first = plain.updates[-1].logprobs[0]
    runner_up = first.top[1].id
    biased = Sampling(temperature=0.0, logprobs=2, logit_bias=((runner_up, 100.0),))

    forced = run_alone(engine, job("b", prompt, max_tokens=1, sampling=biased)).updates[-1].logprobs[0]

    assert forced.token.id == runner_up
    assert forced.token.logprob > -1e-3  # +100 leaves nearly all the mass on it


def test_a_bias_on_a_token_outside_the_vocabulary_is_refused(engine):
    prompt = chat_prompt(engine, QUESTION)
    with pytest.raises(InvalidRequest, match="outside the vocabulary"):
        engine.submit(job("x", prompt, sampling=Sampling(logit_bias=((10**7, 5.0),))))
    assert engine.free_rows == 4
