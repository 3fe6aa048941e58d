"""n choices on the MLX engine: the prompt is prefilled once, the other choices start from its KV
blocks (a copy of a part-filled last one) and recurrent state, and decode beside it."""

from __future__ import annotations

import pytest

from kinfer.protocol import Sampling
from tests.engines.mlx.fixtures import *  # noqa: F403
from tests.engines.mlx.fixtures import chat, job, run_alone, run_jobs

SEEDED = Sampling(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=11)
PROMPT = chat("Tell me a story about a cat and a long road home.")


@pytest.mark.parametrize("arch", ["llama", "qwen3_5"])  # attention KV; recurrent state
def test_greedy_choices_all_equal_the_single_reply(arch, tiny_models, make_mlx):
    engine = make_mlx(tiny_models[arch], prefix_cache=False)
    prompt = engine.tokenize(PROMPT)
    alone = run_alone(engine, job("one", prompt, max_tokens=12))

    three = run_jobs(engine, [job("n", prompt, max_tokens=12, choices=3)])

    assert three["n"].text == three["n#1"].text == three["n#2"].text == alone.text


def test_choices_of_a_pooled_prompt_fork_from_the_adopted_copy(tiny_llama, make_mlx):
    """The prompt's KV comes from the prefix pool, its part-filled last block by a copy that waits for
    the next step; the choices fork off that block in the same step, before the copy is made."""
    engine = make_mlx(tiny_llama)
    prompt = engine.tokenize(PROMPT)
    assert len(prompt) % 64 not in (0, 1)  # the adopted prefix ends inside a block
    alone = run_alone(engine, job("one", prompt, max_tokens=12))

    three = run_jobs(engine, [job("n", prompt, max_tokens=12, choices=3)])

    assert three["n"].reused_tokens > 0
    assert three["n"].text == three["n#1"].text == three["n#2"].text == alone.text


@pytest.mark.parametrize("arch", ["llama", "qwen3_5"])
def test_seeded_choices_differ_repeat_and_prefill_once(arch, tiny_models, make_mlx):
    engine = make_mlx(tiny_models[arch], prefix_cache=False)
    prompt = engine.tokenize(PROMPT)
    single = run_alone(engine, job("one", prompt, max_tokens=12, sampling=SEEDED))
    before = engine.stats().prompt_tokens_total

    first = run_jobs(engine, [job("a", prompt, max_tokens=12, sampling=SEEDED, choices=4)])

    # the prompt but its last token goes through prefill once; each row feeds the last one itself
    assert engine.stats().prompt_tokens_total - before == len(prompt) - 1
    again = run_jobs(engine, [job("b", prompt, max_tokens=12, sampling=SEEDED, choices=4)])
    texts = [first[k].text for k in ("a", "a#1", "a#2", "a#3")]
    assert len(set(texts)) == 4
    assert texts == [again[k].text for k in ("b", "b#1", "b#2", "b#3")]
    assert texts[0] == single.text
    assert engine.free_rows == 4


def test_cancelling_before_the_fork_ends_every_choice_and_frees_the_slots(tiny_llama, make_mlx):
    engine = make_mlx(tiny_llama, prefix_cache=False)
    engine.submit(job("a", engine.tokenize(PROMPT), max_tokens=8, choices=3))
    assert engine.free_rows == 1

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


def test_each_choice_is_biased_and_reports_its_own_logprobs(tiny_models, make_mlx):
    engine = make_mlx(tiny_models["llama"], prefix_cache=False)
    prompt = engine.tokenize(PROMPT)
    sampling = Sampling(temperature=0.0, logit_bias=((7, 3.0),), logprobs=2)
    single = run_alone(engine, job("one", prompt, max_tokens=6, sampling=sampling))

    three = run_jobs(engine, [job("n", prompt, max_tokens=6, sampling=sampling, choices=3)])

    def records(result) -> list[tuple[int, list[int]]]:
        return [(lp.token.id, [t.id for t in lp.top]) for u in result.updates for lp in u.logprobs]

    def values(result) -> list[float]:
        return [lp.token.logprob for u in result.updates for lp in u.logprobs]

    assert records(single)
    for key in ("n", "n#1", "n#2"):
        assert records(three[key]) == records(single)
        assert values(three[key]) == pytest.approx(values(single), abs=1e-3)
