"""Recurrent models on the llama.cpp engine (a tiny random-weight Mamba): rows batch like any other,
and the prefix pool adopts only whole saved checkpoints, because recurrent state cannot be cut back."""

from __future__ import annotations

from pathlib import Path

import pytest

from kinfer.engines.llama.engine import LlamaEngine
from kinfer.engines.prefix_index import common_prefix_length
from tests.engines.llama.fixtures import job, run_alone, run_jobs, tiny_mamba_gguf

__all__ = ["tiny_mamba_gguf"]

SYSTEM = "<|im_start|>system\nYou are a terse assistant of a bakery in Lyon.<|im_end|>\n"


@pytest.fixture
def make_mamba(tiny_mamba_gguf: Path):
    engines: list[LlamaEngine] = []

    def make(**kw) -> LlamaEngine:
        engine = LlamaEngine(tiny_mamba_gguf, name="tiny-mamba", ctx=512, threads=1, **kw)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()


def turn(engine: LlamaEngine, user: str, system: str = SYSTEM) -> tuple[int, ...]:
    return tuple(engine.tokenize(f"{system}<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"))


def test_a_recurrent_model_is_reported_as_such(make_mamba):
    engine = make_mamba(rows=1)

    assert (engine.info.architecture, engine.info.recurrent) == ("mamba", True)


def test_recurrent_rows_batched_match_their_solo_runs(make_mamba):
    engine = make_mamba(rows=3, prefix_cache=False)
    questions = ["Hello", "When do you open?", "Any croissants left?", "Bye"]
    jobs = [job(f"q{i}", turn(engine, q), max_tokens=16) for i, q in enumerate(questions)]

    together = run_jobs(engine, jobs)  # four jobs on three rows: the last one takes a freed row

    for one in jobs:
        alone = run_alone(engine, one)
        assert together[one.job_id].text == alone.text, one.job_id
    assert len({r.text for r in together.values()}) == len(jobs), "the replies depend on the prompt"


def test_a_saved_checkpoint_is_adopted_and_gives_the_cold_run_tokens(make_mamba):
    engine = make_mamba(rows=2)
    cold = make_mamba(rows=1, prefix_cache=False)
    system = tuple(engine.tokenize(SYSTEM))
    first, second = turn(engine, "When do you open?"), turn(engine, "Any croissants left?")
    assert common_prefix_length(first, second) > len(system) >= 32

    run_alone(engine, job("t1", first, checkpoints=(len(system),)))
    warm = run_alone(engine, job("t2", second, max_tokens=16))

    assert warm.reused_tokens == len(system), "the checkpoint, not the longer shared prefix"
    assert warm.text == run_alone(cold, job("c2", second, max_tokens=16)).text


def test_a_prefix_that_ends_between_checkpoints_is_not_adopted(make_mamba):
    engine = make_mamba(rows=2)
    first = turn(engine, "When do you open?")
    run_alone(engine, job("t1", first))  # saves only its whole prompt and reply
    other = turn(engine, "Hi", system=SYSTEM.replace("Lyon", "Paris"))
    assert common_prefix_length(first, other) >= 32

    again = run_alone(engine, job("t2", other))

    assert again.reused_tokens == 0
    assert engine.stats().prefix_hits == 0
