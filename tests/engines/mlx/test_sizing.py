"""The MLX engine's sizing under a memory budget (pure arithmetic over a qwen3.5-0.8b-shaped config)."""

from __future__ import annotations

import pytest

from kinfer.engines.mlx import shape_buckets
from kinfer.engines.mlx.attention_ops import SHORT_CONTEXT
from kinfer.engines.mlx.kv import BLOCK
from kinfer.engines.mlx.prefix import STATE_BYTES
from kinfer.engines.mlx.sdpa_buckets import LONG_CONTEXT_QUERIES
from kinfer.engines.mlx.sizing import plan_size
from kinfer.errors import InvalidRequest
from kinfer.store.model_shape import shape_from_config
from tests.engines.mlx.fixtures import padded  # noqa: F401

GIB = 1 << 30
WEIGHTS = int(1.6 * GIB)
CONFIG = {
    "model_type": "qwen3_5",
    "torch_dtype": "bfloat16",
    "text_config": {
        "hidden_size": 1024,
        "num_hidden_layers": 24,
        "full_attention_interval": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "vocab_size": 248320,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 16,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
    },
}
KV_PER_TOKEN = 6 * 2 * 2 * 256 * 2  # 6 attention layers x K and V x 2 heads x 256 x bf16


def plan(**kw):
    args = dict(
        rows=0,
        ctx=0,
        gpu=True,
        train_context=262144,
        config=CONFIG,
        attention_layers=6,
        prefix_cache=True,
        prefill_chunk=0,
        weights=WEIGHTS,
        available=120 * GIB,
    )
    args.update(kw)
    return plan_size(**args)


def planned_bytes(p) -> int:
    """Everything the plan lets the engine hold at once: each row's recurrent state three times over (its
    last pass's output, and the new state of the pass running and of the one being built)."""
    state = shape_from_config(CONFIG).state_bytes_per_row
    kv = p.max_blocks * BLOCK * KV_PER_TOKEN
    return WEIGHTS + p.cache_limit + p.scratch_bytes + p.pool_state_bytes + kv + 3 * p.rows * state


def test_without_a_budget_the_plan_is_the_automatic_one():
    p = plan(budget=0)
    assert (p.rows, p.ctx, p.pool_state_bytes, p.cache_limit) == (16, 32768, STATE_BYTES, 4 * GIB)


@pytest.mark.parametrize("budget_gib", [3, 4, 8, 16, 32])
def test_everything_the_plan_holds_fits_the_budget(budget_gib):
    p = plan(budget=budget_gib * GIB)
    assert planned_bytes(p) <= budget_gib * GIB
    assert p.cache_limit <= budget_gib * GIB // 10
    assert p.rows >= 1 and p.ctx >= 512


def test_a_smaller_budget_shrinks_the_context_first_then_rows():
    roomy, tight = plan(budget=32 * GIB), plan(budget=3 * GIB)
    assert tight.ctx < roomy.ctx and tight.max_blocks < roomy.max_blocks
    assert tight.pool_state_bytes < roomy.pool_state_bytes
    assert plan(budget=3 * GIB, ctx=8192).rows < 16  # an explicit context: rows give way


def test_what_the_budget_cannot_hold_is_refused():
    with pytest.raises(InvalidRequest, match="memory budget"):
        plan(budget=GIB)  # not even the weights
    with pytest.raises(InvalidRequest, match="memory budget"):
        plan(budget=3 * GIB, ctx=262144)  # one row of the whole train context


@pytest.mark.usefixtures("padded")
def test_on_cuda_the_scratch_holds_a_long_chunks_scores_where_the_composition_writes_them():
    # past SHORT_CONTEXT a pass whose scores fit 512 MiB is MLX's composition (long_context.py): its
    # bf16 scores and their softmax live at once; a larger one is cuDNN's. One row of a 256-token chunk
    # here, and a pass of the default 16 rows of 2,048 tokens (capped)
    on = plan(budget=0, ctx=32768, prefill_chunk=LONG_CONTEXT_QUERIES, rows=1)
    wide = plan(budget=0, ctx=32768, prefill_chunk=2048)  # 16 rows
    short = plan(budget=0, ctx=SHORT_CONTEXT, prefill_chunk=LONG_CONTEXT_QUERIES)
    shape_buckets.set_enabled(False)
    off = plan(budget=0, ctx=32768, prefill_chunk=LONG_CONTEXT_QUERIES, rows=1)
    assert on.scratch_bytes - off.scratch_bytes == 2 * 2 * 8 * LONG_CONTEXT_QUERIES * 32768  # 8 heads
    assert wide.scratch_bytes - plan(budget=0, ctx=32768, prefill_chunk=2048).scratch_bytes == 2 * (512 << 20)
    assert (
        short.scratch_bytes
        == plan(budget=0, ctx=SHORT_CONTEXT, prefill_chunk=LONG_CONTEXT_QUERIES).scratch_bytes
    )
