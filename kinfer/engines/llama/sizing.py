"""How big a llama.cpp context to build: rows, tokens per row, prefix-pool slots, threads.

Pure arithmetic over the model's facts and the machine, so it is easy to test and to explain in logs.
Each sequence id owns its own KV stream of `ctx` cells (kv_unified=False, see llama.py), so the KV
memory is (rows + pool slots) x ctx x bytes per token, allocated once and bounded by construction.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import psutil

from kinfer.errors import InvalidRequest

log = logging.getLogger(__name__)

DEFAULT_CTX = 4096  # tokens per row when automatic, capped by the model's train context
MIN_CTX = 512  # automatic sizing never shrinks a row below this
CTX_ALIGN = 256  # llama.cpp pads each sequence's share of n_ctx to 256 cells
ROWS_CPU = 4
ROWS_GPU = 16
KV_MEMORY_SHARE = 0.5  # automatic sizing lets the KV cache take at most this share of free memory
TOKEN_BUDGET = 2048  # tokens per decode step (n_batch): generating rows first, then prompt chunks
UBATCH = 512
MIN_PROMPT_BUDGET = 16  # tokens a step can always give to waiting prompts
# llama.cpp's compute buffer is mostly a micro-batch's float32 logits (measured on SmolLM2: 98 MiB for
# 512 x 49,152); the margin covers the layers' temporaries
SCRATCH_MARGIN = 1.25


@dataclass(frozen=True)
class SizePlan:
    """The context's shape, as decided by `plan_size`."""

    rows: int
    ctx: int  # tokens per row
    pool_slots: int  # extra sequence ids holding saved prompts
    threads: int
    n_batch: int = TOKEN_BUDGET
    n_ubatch: int = UBATCH

    @property
    def n_seq(self) -> int:
        return self.rows + self.pool_slots

    @property
    def n_ctx(self) -> int:
        return self.n_seq * self.ctx


def available_threads() -> int:
    """The cores this process may run on (llama.cpp's own default is half the machine's cores)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def align_ctx(ctx: int) -> int:
    return max(CTX_ALIGN, -(-ctx // CTX_ALIGN) * CTX_ALIGN)


def plan_size(
    *,
    rows: int,
    ctx: int,
    threads: int,
    prefix_cache: bool,
    gpu: bool,
    train_context: int,
    kv_bytes_per_token: int,
    max_sequences: int,
    step_tokens: int = 0,
    free_memory: int | None = None,
    min_ctx: int = 0,
    budget: int = 0,
    weights: int = 0,
    state_bytes_per_row: int = 0,
    n_vocab: int = 0,
) -> SizePlan:
    """Fill in the automatic (0) settings.

    ctx: min(train context, 4096); rows: 4 on CPU, 16 with a GPU backend; one pool slot per row when
    the prefix cache is on. Automatic rows (then automatic ctx) shrink until the KV cache fits in
    half the free memory; explicit settings are taken as given. step_tokens: the per-step token
    budget (llama.cpp's n_batch), 0 = TOKEN_BUDGET. min_ctx: a request's larger context (Ollama's
    num_ctx) raises an automatic one, taken then as given; it never shrinks it.

    budget (bytes, 0: none): the weights, the compute buffers and the KV (and recurrent state) of
    rows and pool slots must fit in it together: automatic rows shrink, then an automatic context,
    then explicit rows (with a warning); an explicit context that cannot fit one row is refused.
    """
    if free_memory is None:
        free_memory = psutil.virtual_memory().available
    auto_rows, auto_ctx = rows <= 0, ctx <= 0
    if ctx > 0 and train_context and ctx > train_context:
        log.warning("context %d is beyond what the model was trained for; using %d", ctx, train_context)
        ctx = train_context
    ctx = align_ctx(ctx if ctx > 0 else min(train_context or DEFAULT_CTX, DEFAULT_CTX))
    if min_ctx > ctx:
        ctx, auto_ctx = align_ctx(min(min_ctx, train_context or min_ctx)), False
    rows = rows if rows > 0 else (ROWS_GPU if gpu else ROWS_CPU)
    per_row_streams = 2 if prefix_cache else 1
    # llama.cpp caps sequence ids at LLAMA_MAX_SEQ (256)
    rows = min(rows, max_sequences // per_row_streams)

    def kv_bytes(r: int, c: int) -> int:
        return r * per_row_streams * c * kv_bytes_per_token

    share = int(free_memory * KV_MEMORY_SHARE)
    while auto_rows and rows > 1 and kv_bytes(rows, ctx) > share:
        rows = max(1, rows // 2)
    while auto_ctx and ctx > MIN_CTX and kv_bytes(rows, ctx) > share:
        ctx = align_ctx(max(MIN_CTX, ctx // 2))
    if kv_bytes(rows, ctx) > free_memory:
        # an explicit --ctx / --parallel (or Ollama's per-request num_ctx) that cannot fit must be
        # refused here: llama.cpp would allocate it and the kernel's OOM killer end the server
        raise InvalidRequest(
            f"a KV cache of {rows} rows x {ctx} tokens needs {kv_bytes(rows, ctx) / 2**30:.1f} GiB but "
            f"{free_memory / 2**30:.1f} GiB is free; ask for a smaller context "
            "(num_ctx / --ctx) or fewer rows"
        )
    if kv_bytes(rows, ctx) > share:
        log.warning(
            "the KV cache (%d rows x %d tokens) needs %.1f GiB, more than half the free memory",
            rows,
            ctx,
            kv_bytes(rows, ctx) / 2**30,
        )
    if budget > 0:
        rows, ctx = _fit_budget(
            rows,
            ctx,
            auto_rows=auto_rows,
            auto_ctx=auto_ctx,
            room=budget - weights - scratch_bytes(n_vocab),
            row_bytes=lambda r, c: kv_bytes(r, c) + r * per_row_streams * state_bytes_per_row,
            budget=budget,
        )
    # every generating row puts one token in each step; leave room for prompt chunks beside them
    n_batch = max(rows + MIN_PROMPT_BUDGET, step_tokens if step_tokens > 0 else TOKEN_BUDGET)
    return SizePlan(
        rows=rows,
        ctx=ctx,
        pool_slots=rows if prefix_cache else 0,
        threads=threads if threads > 0 else available_threads(),
        n_batch=n_batch,
        n_ubatch=min(UBATCH, n_batch),
    )


def scratch_bytes(n_vocab: int, n_ubatch: int = UBATCH) -> int:
    """A bound on llama.cpp's compute and output buffers (see SCRATCH_MARGIN)."""
    return int(4 * n_ubatch * n_vocab * SCRATCH_MARGIN)


def _fit_budget(
    rows: int, ctx: int, *, auto_rows: bool, auto_ctx: bool, room: int, row_bytes, budget: int
) -> tuple[int, int]:
    """Rows and ctx whose memory fits `room` (what the budget leaves beside weights and scratch)."""
    if room <= 0:
        raise InvalidRequest(
            f"the memory budget ({budget / 2**30:.2f} GiB) does not hold the model's weights and "
            "compute buffers; raise --memory-budget"
        )
    planned = rows
    while row_bytes(rows, ctx) > room:
        if auto_rows and rows > 1:
            rows = max(1, rows // 2)
        elif auto_ctx and ctx > MIN_CTX:
            ctx = align_ctx(max(MIN_CTX, ctx // 2))
        elif rows > 1:
            rows -= 1
        else:
            raise InvalidRequest(
                f"one row of {ctx} tokens needs {row_bytes(1, ctx) / 2**30:.2f} GiB but the memory "
                f"budget leaves {room / 2**30:.2f} GiB beside the weights; ask for a smaller context "
                "(num_ctx / --ctx) or raise --memory-budget"
            )
    if rows < planned and not auto_rows:
        log.warning("the memory budget holds %d rows of %d tokens, not %d", rows, ctx, planned)
    return rows, ctx
