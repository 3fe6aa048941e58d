"""A burst of prompts arriving while rows decode (the MLX engine): they are prefilled together, in few
passes a step (rows.plan_prefill pads them to a shared length), and each reply is still mlx-lm's own."""

from __future__ import annotations

from kinfer.engines.mlx import kv
from kinfer.engines.prefill_budget import UNTIMED_BESIDE_DECODE, PrefillBudget, StepClock
from tests.engines.mlx.fixtures import *  # noqa: F403
from tests.engines.mlx.fixtures import chat, job, mlx_lm_greedy, readable, run_alone, run_jobs
from tests.engines.mlx.test_engine import QUESTIONS

BURST = [chat(QUESTIONS[2] + " and" * i) for i in range(8)]  # 8 prompts of 8 lengths


def test_a_burst_beside_a_decoding_row_is_prefilled_in_few_passes_and_steps(tiny_qwen3, make_mlx):
    # a budget no step on any machine exceeds: what limits the chunks is the plan, counted in steps
    engine = make_mlx(tiny_qwen3, rows=9, prefill_chunk=1024, step_budget_ms=600_000, prefix_cache=False)
    prompts = [engine.tokenize(p) for p in BURST]
    assert len({len(p) for p in prompts}) == len(prompts)  # each would be its own pass, unpadded
    passes: list[int] = [0]
    forward = engine.forward

    def counted(inputs, views):
        passes[-1] += 1
        return forward(inputs, views)

    engine.forward = counted
    engine.submit(job("runner", engine.tokenize(chat(QUESTIONS[0])), max_tokens=1000, ignore_eos=True))
    while not any(u.new_tokens for u in engine.step()):
        pass

    def burst(name: str) -> dict[str, int]:
        """Submit the burst beside the runner; the step at which each prompt's first token came."""
        for i, prompt in enumerate(prompts):
            engine.submit(job(f"{name}{i}", prompt, max_tokens=2))
        passes[:] = [0]
        first: dict[str, int] = {}
        finished = 0
        for step in range(100):
            for update in engine.step():
                if update.job_id.startswith(name):
                    first.setdefault(update.job_id, step) if update.new_tokens else None
                    finished += update.finish is not None
            if finished == len(prompts):
                return first
            passes.append(0)
        raise AssertionError("the burst did not finish")

    burst("warm")  # the first burst after loading: the budget learns the speed, its chunk grows
    first = burst("b")
    # the chunk keeps what it grew to (a prompt's small tail at the end of the first burst does not
    # shrink it): 512 then 1,024 prompt tokens, the whole burst in two steps, tokens read two later
    assert max(first.values()) <= 4, first
    assert max(passes) <= 3, passes  # the decode pass and at most two prefill passes a step


def pooled_and_fresh_prompts(engine) -> list[list[int]]:
    """Seed the engine's prefix pool with two prefixes of different lengths; return two prompts that
    continue them (adopted, then continued chunks) and two fresh ones (padded chunks)."""
    system = "You are a careful assistant who answers in one short sentence. " * 3
    seeds = [chat(QUESTIONS[1], system=system), chat(QUESTIONS[2], system=system + "Be brief. ")]
    for i, seed in enumerate(seeds):
        run_alone(engine, job(f"seed{i}", engine.tokenize(seed), max_tokens=2))
    return [
        engine.tokenize(chat(QUESTIONS[1] + " And of Italy?", system=system)),
        engine.tokenize(chat(QUESTIONS[2] + " Briefly.", system=system + "Be brief. ")),
        engine.tokenize(chat(QUESTIONS[0])),
        engine.tokenize(chat(QUESTIONS[1])),
    ]


def test_padded_and_continued_chunks_together_give_mlx_lms_tokens(tiny_qwen3, make_mlx, monkeypatch):
    engine = make_mlx(tiny_qwen3, rows=6, prefill_chunk=512)
    prompts = pooled_and_fresh_prompts(engine)
    batched = []
    original = kv.PagedKV._attend_prefill_batched

    def spy(self, *args, **kwargs):
        batched.append(self.layout.starts.tolist())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(kv.PagedKV, "_attend_prefill_batched", spy)
    results = run_jobs(engine, [job(f"p{i}", p, max_tokens=8) for i, p in enumerate(prompts)])
    assert results["p0"].reused_tokens and results["p1"].reused_tokens
    assert any(len(set(starts)) > 1 for starts in batched)  # rows at different positions, one call
    for i, prompt in enumerate(prompts):
        assert readable(results[f"p{i}"].text) == mlx_lm_greedy(tiny_qwen3, prompt, 8)[1], i


def test_untimed_the_second_half_of_a_burst_still_prefills_at_the_bursts_share(tiny_qwen3, make_mlx):
    """MLX on CUDA (an untimed budget): 6 prompts waiting beside 12 rows that started decoding first
    get three 256-token shares a step, not one: the rows decoding are the burst's own first half."""
    engine = make_mlx(tiny_qwen3, rows=18, ctx=1024, prefill_chunk=2048, prefix_cache=False)
    engine._clock = StepClock(PrefillBudget.on(0, 2048, gpu=True, timed=False))  # what CUDA gets
    for i in range(12):
        engine.submit(job(f"first{i}", engine.tokenize(chat(QUESTIONS[0])), max_tokens=50, ignore_eos=True))
    while sum(row is not None and row.ready for row in engine._slots) < 12:
        engine.step()
    long_question = QUESTIONS[3] * 2  # ~150 tokens each: more than a 256-token share holds
    for i in range(6):
        engine.submit(job(f"second{i}", engine.tokenize(chat(long_question + " and" * i)), max_tokens=2))
    prefilled = []
    while len(prefilled) < 3:
        engine.step()
        if engine._step_prefill:
            prefilled.append(engine._step_prefill)
    assert prefilled[0] > 2 * UNTIMED_BESIDE_DECODE, prefilled  # 6 waiting: 3 shares, up to 768 tokens
