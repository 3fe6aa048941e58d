"""The MLX engine's prompt chunks beside decoding rows follow the step time budget
(engines/prefill_budget.py), and the tokens stay mlx-lm's own."""

from __future__ import annotations

from kinfer.engines.prefill_budget import FIRST_CHUNK, MIN_CHUNK
from tests.engines.mlx.fixtures import *  # noqa: F403
from tests.engines.mlx.fixtures import chat, job, mlx_lm_greedy, readable, run_jobs
from tests.engines.mlx.test_engine import QUESTIONS


def chunk_sizes(updates) -> list[int]:
    seen = [u.prompt_processed for u in updates if u.prompt_processed and not u.new_tokens]
    return [b - a for a, b in zip([0, *seen], seen, strict=False)]


def test_beside_a_decoding_row_a_prompt_advances_in_small_chunks_and_alone_in_whole_ones(
    tiny_qwen3, make_mlx
):
    # a budget no step can keep: every step beside the runner takes the least a prompt may advance
    engine = make_mlx(tiny_qwen3, rows=2, prefill_chunk=128, step_budget_ms=0.001, prefix_cache=False)
    runner = engine.tokenize(chat(QUESTIONS[0]))
    long_prompt = engine.tokenize(chat(QUESTIONS[3] * 2))
    assert len(long_prompt) > 200
    engine.submit(job("runner", runner, max_tokens=400, ignore_eos=True))
    while not any(u.new_tokens for u in engine.step()):
        pass
    engine.submit(job("long", long_prompt, max_tokens=6))
    beside = []
    while not any(u.finish for u in beside):
        updates = engine.step()
        assert [u.new_tokens for u in updates if u.job_id == "runner"] == [1]  # a token every step
        beside += [u for u in updates if u.job_id == "long"]
    engine.cancel("runner")
    engine.step()

    alone = run_jobs(engine, [job("long", long_prompt, max_tokens=6)])["long"]

    sizes = chunk_sizes(beside)
    assert max(sizes) <= FIRST_CHUNK  # before the speed is measured
    # then the least a prompt may advance, every step (on a loaded machine a step can come out faster
    # than the smoothed decode step: that one teaches no speed, and the next chunk is a first one again)
    assert sum(size > MIN_CHUNK for size in sizes[2:]) <= 3, sizes
    assert len(sizes) >= len(long_prompt) // MIN_CHUNK - 2
    assert max(chunk_sizes(alone.updates)) == 128  # nobody decodes: whole chunks
    expected = mlx_lm_greedy(tiny_qwen3, long_prompt, 6)[1]
    assert readable("".join(u.text for u in beside)) == readable(alone.text) == expected
