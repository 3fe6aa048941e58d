"""The llama.cpp engine's prompt chunks beside generating rows follow the step time budget
(engines/prefill_budget.py); a prompt chunked that way still gives its solo run's tokens."""

from __future__ import annotations

from kinfer.engines.prefill_budget import FIRST_CHUNK, MIN_CHUNK
from tests.engines.llama.fixtures import chat_prompt, job, make_engine, run_alone

__all__ = ["make_engine"]

LONG = "Here is a list to remember. " + " ".join(
    f"Item {i} is a {('red', 'blue')[i % 2]} box." for i in range(40)
)


def chunk_sizes(updates) -> list[int]:
    seen = [u.prompt_processed for u in updates if u.prompt_processed and not u.new_tokens]
    return [b - a for a, b in zip([0, *seen], seen, strict=False)]


def test_beside_a_generating_row_a_prompt_advances_in_small_chunks_with_its_solo_tokens(make_engine):
    # a budget no step can keep: every step beside the runner takes the least a prompt may advance
    engine = make_engine(rows=2, prefix_cache=False, step_budget_ms=0.001)
    runner = chat_prompt(engine, "Tell me a long story.")
    long_prompt = chat_prompt(engine, LONG + " Which item is the last one?")
    assert len(long_prompt) > 200
    engine.submit(job("runner", runner, max_tokens=400, ignore_eos=True))
    while not any(u.new_tokens for u in engine.step()):
        pass
    engine.submit(job("long", long_prompt, max_tokens=8))
    beside = []
    while not any(u.finish for u in beside):
        updates = engine.step()
        assert [u.new_tokens for u in updates if u.job_id == "runner"] == [1]  # a token every step
        beside += [u for u in updates if u.job_id == "long"]
    engine.cancel("runner")
    engine.step()

    alone = run_alone(engine, job("long", long_prompt, max_tokens=8))

    sizes = chunk_sizes(beside)
    assert max(sizes) <= FIRST_CHUNK  # before the speed is measured
    assert max(sizes[2:]) <= MIN_CHUNK  # then the least a prompt may advance, every step
    assert len(sizes) >= len(long_prompt) // MIN_CHUNK - 2
    assert len(chunk_sizes(alone.updates)) <= 1  # nobody generates: the whole prompt in one step
    assert "".join(u.text for u in beside) == alone.text
