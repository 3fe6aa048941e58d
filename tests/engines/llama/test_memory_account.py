"""The llama.cpp engine's memory account: the MLX engine's part names, made of the buffers llama.cpp
says it allocated; and its memory budget, which shrinks rows and context while replies still come."""

from __future__ import annotations

from pathlib import Path

from kinfer.engines.llama.engine import LlamaEngine
from kinfer.engines.llama.memory import BufferSizes, llama_account, parse_buffer_sizes
from kinfer.engines.memory_account import PARTS
from tests.engines.llama.fixtures import *  # noqa: F403
from tests.engines.llama.fixtures import SYSTEM, chat_prompt, job, run_alone, run_jobs

MIB = 1 << 20
GIB = 1 << 30


def test_the_log_lines_of_every_device_are_added_up():
    lines = [
        "load_tensors:   CPU_Mapped model buffer size =    92.10 MiB",
        "load_tensors:        CUDA0 model buffer size =  1024.00 MiB",
        "llama_kv_cache:      CUDA0 KV buffer size =    45.00 MiB",
        "llama_memory_recurrent:      CUDA0 RS buffer size =     3.00 MiB",
        "llama_context:  CUDA_Host  output buffer size =     0.75 MiB",
        "sched_reserve:      CUDA0 compute buffer size =    98.25 MiB",
        "sched_reserve:  CUDA_Host compute buffer size =     2.00 MiB",
        "llama_kv_cache: size =   45.00 MiB (   512 cells,  30 layers,  4/4 seqs)",  # a summary, not a buffer
    ]

    sizes = parse_buffer_sizes(lines)

    assert sizes.weights == round(1116.10 * MIB)
    assert (sizes.kv, sizes.state) == (45 * MIB, 3 * MIB)
    assert sizes.scratch == round(101.0 * MIB)


def test_the_pool_slots_recurrent_state_is_the_pools_part():
    account = llama_account(
        BufferSizes(weights=100, kv=40, state=80, scratch=10), weights=0, kv=0, pool_slots=2, sequences=4
    )

    assert (account.state, account.pool) == (40, 40)
    assert account.total == 100 + 40 + 80 + 10 == account.named and account.unexplained == 0


def test_the_engine_reports_the_same_parts_as_mlx_and_they_add_up(make_engine):
    engine = make_engine(rows=2, ctx=512)
    run_alone(engine, job("a", chat_prompt(engine, "When do you open?", system=SYSTEM), max_tokens=4))

    memory = engine.stats().memory
    assert set(PARTS) | {"total", "budget"} <= set(memory)
    assert sum(memory[part] for part in PARTS) == memory["total"]
    # SmolLM2's own numbers: 2 rows + 2 pool slots x 512 cells x 30 layers x 3 KV heads x 128 x 2 bytes
    assert memory["kv"] == 4 * 512 * 30 * 3 * 128 * 2
    assert abs(memory["weights"] - engine._facts.model_bytes) < MIB
    assert memory["scratch"] > 0 and memory["cache"] == memory["state"] == memory["pool"] == 0


def test_a_recurrent_models_state_is_split_between_rows_and_pool(tiny_mamba_gguf: Path):
    engine = LlamaEngine(tiny_mamba_gguf, name="tiny-mamba", rows=2, ctx=512, threads=1)
    try:
        memory = engine.stats().memory
        assert memory["state"] > 0 and memory["pool"] == memory["state"]  # as many pool slots as rows
        assert sum(memory[part] for part in PARTS) == memory["total"]
    finally:
        engine.close()


def test_a_budget_smaller_than_the_plan_shrinks_it_and_replies_still_come(make_engine):
    unbounded = make_engine(rows=0, ctx=0, memory_budget_gb=-1)
    weights = unbounded.stats().memory["weights"]
    # the weights, SmolLM2's compute buffers (~100 MiB) and 40 MiB for KV: not 4 rows + 4 pool slots x 4096
    budget = weights + 125 * MIB + 40 * MIB
    small = make_engine(rows=0, ctx=0, memory_budget_gb=budget / GIB)

    assert (small.plan.rows, small.plan.ctx) < (unbounded.plan.rows, unbounded.plan.ctx)
    memory = small.stats().memory
    assert memory["total"] <= budget == memory["budget"]
    prompts = [chat_prompt(small, f"Question {i}: when do you open?", system=SYSTEM) for i in range(3)]
    results = run_jobs(small, [job(f"q{i}", p, max_tokens=4) for i, p in enumerate(prompts)])
    assert all(r.new_tokens == 4 for r in results.values())


def test_the_embedding_context_of_a_chat_model_is_counted_once_made(make_engine):
    engine = make_engine(rows=1, ctx=512)
    before = engine.stats().memory
    engine.embed([tuple(engine.embed_tokenize("When do you open?"))])

    after = engine.stats().memory
    assert after["scratch"] > before["scratch"] and after["kv"] > before["kv"]
    assert sum(after[part] for part in PARTS) == after["total"] > before["total"]
