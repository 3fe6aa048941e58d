"""--flash-attn: llama.cpp's flash attention stays off on a CPU unless asked for (its CPU kernel rounds
differently by the pass's shape, so a batched or pooled reply would not match its solo run); asked
for, it runs and replies as the plain path does where the answer is clear."""

from __future__ import annotations

from tests.engines.llama.fixtures import chat_prompt, job, make_engine, run_alone, run_jobs

__all__ = ["make_engine"]

CLEAR = "What is the capital of France?"


def test_auto_leaves_flash_attention_off_on_a_cpu_and_on_turns_it_on(make_engine):
    on_cpu = {"rows": 2, "ctx": 256, "gpu_layers": 0}  # a GPU backend's auto would turn it on
    assert make_engine(**on_cpu).flash_attention is False
    assert make_engine(**on_cpu, flash_attn=False).flash_attention is False
    assert make_engine(**on_cpu, flash_attn=True).flash_attention is True


def test_with_flash_attention_a_batch_replies_in_full_and_a_clear_answer_is_unchanged(make_engine):
    plain = make_engine(rows=4, prefix_cache=False, gpu_layers=0)
    flash = make_engine(rows=4, prefix_cache=False, gpu_layers=0, flash_attn=True)
    expected = run_alone(plain, job("plain", chat_prompt(plain, CLEAR), max_tokens=12))

    questions = [CLEAR, "Name three colors.", "Write a haiku about rain.", "What is 2 + 2?"]
    jobs = [
        job(f"q{i}", chat_prompt(flash, q), max_tokens=12, ignore_eos=True) for i, q in enumerate(questions)
    ]
    replies = run_jobs(flash, jobs)

    assert all(r.new_tokens == 12 and r.finish == "length" and r.text.strip() for r in replies.values())
    assert replies["q0"].text.startswith(expected.text.strip())  # the same words, then past EOS
