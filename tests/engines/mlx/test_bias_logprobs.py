"""logit_bias and logprobs on the MLX engine (SmolLM2 in float32): the bias is added to the batch's
logits on the device, before the grammar's mask and the draw; only rows that ask for logprobs get a
log-softmax, read back with the step's tokens."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from kinfer.errors import InvalidRequest
from kinfer.protocol import Sampling
from tests.engines.constrained import free_job
from tests.engines.mlx.fixtures import *  # noqa: F403
from tests.engines.mlx.fixtures import run_alone, run_jobs

pytestmark = pytest.mark.slow

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def engine(smollm_f32):
    from kinfer.engines.mlx.engine import MlxEngine

    engine = MlxEngine(smollm_f32.hf_dir, name="smollm2-f32", rows=3, ctx=512)
    yield engine
    engine.close()


def records(result) -> list:
    return [lp for update in result.updates for lp in update.logprobs]


def test_greedy_logprobs_choose_the_top_token_and_sum_to_a_solo_scoring(engine, smollm_f32):
    import mlx_lm

    asking = free_job(engine, "lp", QUESTION, max_tokens=10, sampling=Sampling(temperature=0.0, logprobs=3))
    free_alone = run_alone(engine, free_job(engine, "free", "Name three fruits.", max_tokens=10)).text
    together = run_jobs(engine, [asking, free_job(engine, "free", "Name three fruits.", max_tokens=10)])
    got = records(together["lp"])

    assert together["free"].text == free_alone  # a row without logprobs shares the step untouched
    assert got and all(not u.logprobs for u in together["free"].updates)
    for lp in got:
        assert len(lp.top) == 3 and lp.top[0].id == lp.token.id
        assert lp.top[0].logprob == pytest.approx(lp.token.logprob, abs=1e-6)

    model, _tokenizer = mlx_lm.load(str(smollm_f32.hf_dir))
    reply = [lp.token.id for lp in got]
    tokens = list(asking.prompt) + reply
    logits = model(mx.array([tokens]))[0].astype(mx.float32)
    logprobs = np.array(logits - mx.logsumexp(logits, axis=-1, keepdims=True), dtype=np.float64)
    start = len(asking.prompt) - 1
    want = sum(logprobs[start + i, t] for i, t in enumerate(reply))
    assert sum(lp.token.logprob for lp in got) == pytest.approx(want, abs=1e-3)


def test_a_banned_token_never_appears_and_a_forced_one_is_every_token(engine):
    first = records(
        run_alone(
            engine,
            free_job(engine, "g", QUESTION, max_tokens=2, sampling=Sampling(temperature=0.0, logprobs=0)),
        )
    )
    banned = first[0].token.id
    ban = Sampling(temperature=1.0, logit_bias=((banned, -100.0),), logprobs=0)
    force = Sampling(temperature=1.0, logit_bias=((banned, 100.0),), logprobs=0)

    results = run_jobs(
        engine,
        [free_job(engine, f"ban{i}", QUESTION, max_tokens=4, sampling=ban) for i in range(5)]
        + [free_job(engine, "force", QUESTION, max_tokens=6, sampling=force)],
    )

    drawn = [lp.token.id for i in range(5) for lp in records(results[f"ban{i}"])]
    assert drawn and banned not in drawn
    assert [lp.token.id for lp in records(results["force"])] == [banned] * 6


def test_a_bias_on_a_token_outside_the_vocabulary_is_refused(engine):
    with pytest.raises(InvalidRequest, match="outside the vocabulary"):
        engine.submit(free_job(engine, "x", QUESTION, sampling=Sampling(logit_bias=((10**7, 1.0),))))
    assert engine.free_rows == 3
