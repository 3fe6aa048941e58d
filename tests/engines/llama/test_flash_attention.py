"""--flash-attn on a CPU. kinfer's setup builds llama.cpp with a batch-invariant flash attention
(engines/llama/invariant_attention.py): `auto` turns it on there, and a reply still matches its solo
run; more, a next turn that reads a decoded reply back from the pool now matches its cold run to the
last bit of every logprob, which the plain kernels never did. With a stock llama-cpp-python, whose
kernel rounds by the pass's shape, `auto` leaves it off on a CPU."""

from __future__ import annotations

import pytest

from kinfer.engines.llama import native
from kinfer.engines.llama.invariant_attention import batch_invariant_cpu_flash_attention
from kinfer.protocol import Sampling
from tests.engines.llama.fixtures import SYSTEM, chat_prompt, job, make_engine, run_alone, run_jobs, two_turns

__all__ = ["make_engine"]

CLEAR = "What is the capital of France?"
ON_CPU = {"rows": 2, "ctx": 1024, "gpu_layers": 0}  # a GPU backend's auto would turn it on
GREEDY_WITH_LOGPROBS = Sampling(temperature=0.0, logprobs=2)

needs_invariant_kernel = pytest.mark.skipif(
    not batch_invariant_cpu_flash_attention(), reason="a stock llama-cpp-python (scripts/setup.sh patches it)"
)


def test_setup_builds_llama_cpp_with_the_batch_invariant_kernel():
    if native.supports_gpu_offload():
        pytest.skip("a GPU build: made by the GPU recipe, whose CPU kernel is not used for replies")
    assert batch_invariant_cpu_flash_attention(), "run scripts/setup.sh: it builds llama.cpp with the patch"


def test_auto_turns_flash_attention_on_a_cpu_only_with_the_batch_invariant_kernel(make_engine):
    assert make_engine(**ON_CPU).flash_attention is batch_invariant_cpu_flash_attention()
    assert make_engine(**ON_CPU, flash_attn=False).flash_attention is False
    assert make_engine(**ON_CPU, flash_attn=True).flash_attention is True


def test_with_flash_attention_a_batch_replies_in_full_and_a_clear_answer_is_unchanged(make_engine):
    plain = make_engine(rows=4, prefix_cache=False, gpu_layers=0, flash_attn=False)
    flash = make_engine(rows=4, prefix_cache=False, gpu_layers=0, flash_attn=True)
    expected = run_alone(plain, job("plain", chat_prompt(plain, CLEAR), max_tokens=12))

    questions = [CLEAR, "Name three colors.", "Write a haiku about rain.", "What is 2 + 2?"]
    jobs = [
        job(f"q{i}", chat_prompt(flash, q), max_tokens=12, ignore_eos=True) for i, q in enumerate(questions)
    ]
    replies = run_jobs(flash, jobs)

    assert all(r.new_tokens == 12 and r.finish == "length" and r.text.strip() for r in replies.values())
    assert replies["q0"].text.startswith(expected.text.strip())  # the same words, then past EOS


def _next_turn(make_engine, system: str = SYSTEM, **kw) -> tuple[list, list]:
    """A second turn's logprobs served warm (the first turn's prompt and reply read from the pool)
    and cold (a fresh engine prefilling all of it)."""
    settings = {**ON_CPU, **kw}
    engine = make_engine(**settings)
    turn1, turn2 = two_turns(engine, system)
    warm = run_alone(engine, job("t2", turn2, max_tokens=16, sampling=GREEDY_WITH_LOGPROBS))
    assert warm.reused_tokens > len(turn1), "the reply's decoded tokens were read back from the pool"
    cold_engine = make_engine(**settings, prefix_cache=False)
    cold = run_alone(cold_engine, job("c2", turn2, max_tokens=16, sampling=GREEDY_WITH_LOGPROBS))
    return [lp for u in warm.updates for lp in u.logprobs], [lp for u in cold.updates for lp in u.logprobs]


@needs_invariant_kernel
def test_a_next_turn_reading_its_decoded_reply_from_the_pool_matches_its_cold_run_to_the_bit(make_engine):
    warm, cold = _next_turn(make_engine)

    assert len(warm) == len(cold) == 16
    assert warm == cold  # every token, its logprob and its alternatives', as floats


@needs_invariant_kernel
def test_a_long_conversation_on_two_threads_matches_its_cold_run_to_the_bit(make_engine):
    # ~800 cells: upstream splits a lone decoding row this long across the threads (other sums than a
    # prefill's); the patch's 256-cell chunks are merged in order whichever thread took each
    long_system = " ".join([SYSTEM] * 12)
    warm, cold = _next_turn(make_engine, system=long_system, threads=2, ctx=2048)

    assert len(warm) == len(cold) >= 8  # the reply may end before 16
    assert warm == cold


def test_without_flash_attention_decoded_cells_round_otherwise_than_a_prefill(make_engine):
    # why the test above needs the invariant kernel: the plain path takes another kernel for a lone
    # token (each decoding row's) than for a prompt's many, so the reply read back differs slightly
    warm, cold = _next_turn(make_engine, flash_attn=False)

    assert len(warm) == len(cold) == 16
    assert warm != cold
