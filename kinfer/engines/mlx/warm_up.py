"""Run the pass shapes a server meets first while it loads, not while replies stream (MLX on CUDA).

On MLX's CUDA backend a pass shape seen for the first time costs the host 180-240 ms (new traces and
JIT-built kernels of the compiled layers, a matrix product's algorithm search), where a step takes
~10 ms. Buckets keep the shapes few (shape_buckets.py), but each still came first once while rows
streamed: on the H200 (qwen3.5-0.8b shape), with 16 rows decoding, a 50,000-token prompt's first
256-token chunk, its last shorter chunk and the first 17-row decode stalled the 16 replies for
188-236 ms each, against a median step of 9 ms. The same first sightings slowed a fresh server's first
burst.

So a CUDA engine runs, at load, one pass of each shape of that kind:
- a decode pass at every row count `shape_buckets.decode_rows` can produce for the engine's rows,
  greedy and sampled with the default parameters (the draw is a graph of its own), and with the fused
  decode kernel (`split`) once more with each row's positions split (split_decode.py: a long row
  joining the batch would otherwise meet that graph first: 68-96 ms steps in the seventh H200 session);
- a one-row prefill pass at every ladder length up to a prompt's share of a step beside decoding rows
  (prefill_budget.UNTIMED_BESIDE_DECODE): a long prompt's chunks and its last, shorter one; on a
  recurrent model both with and without a padded end (its padding mask is a different graph); each
  length again past position 0, where the chunk's keys stop short of their bucket and the attention
  masks the padding (a long prompt's second chunk, or a prompt's first after a pooled preamble: on the
  H200 both parts of that chunk instantiated 5 new CUDA graphs each, 9-12 ms of host time a step,
  while the chunks at position 0 and later ones instantiated none; 2026-12-05 in docs/benchmarks.md);
  where the engine runs a prompt's chunks a few layers a step (prompt_passes.py), in those parts too. These
  also trace the compiled functions one row's chunks run through (compiled_step.py, compiled_layers.py).
Prefill passes with several rows (a burst's prompts together) come in too many shapes to run all.
Then the decode step's work around the pass that no shape above reaches (`warm_step_ops`): rows fed
from last step's tokens in a new order or beside host tokens, penalties' history, logprobs, a
grammar's mask, a logit bias. Their gathers and scatters are kernels MLX's CUDA backend compiles at
first use, one module per op, data and index dtype (3-4 s of NVRTC each on the H200, once per machine:
then read from MLX's PTX cache, ptx_cache.py). Left to serving, on a fresh H200 the first decode step
of rows coming and going compiled four of them: 15.3 s without a token for anyone.

Each pass is evaluated on its own, as serving evaluates each pass of a step on its own (the engine's
`_launch`): MLX cuts an eval into CUDA graphs of ~20 kernels and instantiates a graph the first time its
topology comes up, so a pass must start a graph where it started here for its graphs to be the same.

The passes run on the engine's scratch slot (the one the decode padding rows point at) with KV blocks
taken for the occasion and given back, so no row's KV, state or pooled prefix is touched; a full
decode batch (every slot in order, no gather) also overwrites the free slots' recurrent state, which a
row resets when it takes a slot. On a CPU or Metal nothing is padded to buckets and nothing runs here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from kinfer.engines.mlx.kv import BLOCK, PassLayout
from kinfer.engines.mlx.logits import LogprobRows, bias_table, with_bias
from kinfer.engines.mlx.rows import feed_tokens
from kinfer.engines.mlx.sampling import PENALTY_WINDOW_MAX, make_batch, mask_logits, push_history, sample
from kinfer.engines.mlx.sdpa_buckets import LONG_CONTEXT_QUERIES
from kinfer.engines.mlx.shape_buckets import MIN_BUCKET, bucket, decode_rows
from kinfer.engines.prefill_budget import UNTIMED_BESIDE_DECODE
from kinfer.protocol import Sampling

log = logging.getLogger(__name__)


# A continued chunk's start in the warm-up: one position in, so its keys (start + chunk) fall short of
# a bucket and the attention masks them as serving's continued chunks do (sdpa_buckets.py).
CONTINUED = 1


@dataclass(frozen=True)
class WarmShape:
    """One pass to run: `rows` rows of `length` tokens (length 1: a decode pass); `padded`: a prefill
    pass whose row ends before its last position (a recurrent model's masked graph)."""

    rows: int
    length: int
    padded: bool = False
    splits: int = 1  # a decode pass's least split of each row's positions (split_decode.py)
    sampled: bool = False  # a decode pass drawing its tokens with the default sampling parameters
    context: int = 0  # a prefill pass's positions before its chunk (the keys it attends to beyond it)
    parts: int = 1  # steps a prompt chunk takes through the layers, each its own eval (prompt_passes.py)

    @property
    def decode(self) -> bool:
        return self.length == 1


def warm_shapes(
    slots: int,
    *,
    recurrent: bool,
    prefill_up_to: int = UNTIMED_BESIDE_DECODE,
    split: bool = False,
    ctx: int | None = None,
    split_parts: Callable[[int], int] = lambda end: 1,
) -> list[WarmShape]:
    """The shapes an engine of `slots` rows runs at load: every decode row count (greedy, sampled,
    and split where `split`: the fused decode kernel serves it), one-row prefill lengths of the
    ladder up to `prefill_up_to` (no longer than a row of `ctx` tokens holds: a small --ctx would
    overrun its table), each again past position 0 (`CONTINUED`), then a chunk of that share at every
    key bucket such a row reaches (cuBLAS's kernels, cuDNN's plan per attention shape). Where
    `split_parts` cuts a chunk ending at a position into parts (prompt_passes.py: a long prompt's
    chunks beside decoding rows), the warm-up runs those parts (each part's graphs are its own): the
    ladder lengths both whole (a prompt that goes in at once) and in parts (a recurrent model's padded
    ones too), the continued and long chunks in parts only."""
    if ctx is not None:
        prefill_up_to = min(prefill_up_to, ctx)
    decode = sorted({decode_rows(n, slots) for n in range(1, slots + 1)})
    lengths = sorted({bucket(n) for n in range(MIN_BUCKET, prefill_up_to + 1)})
    shapes = [WarmShape(rows, 1) for rows in decode]
    shapes += [WarmShape(rows, 1, sampled=True) for rows in decode]
    if split:
        shapes += [WarmShape(rows, 1, splits=2) for rows in decode]
    for length in lengths:
        shapes.append(WarmShape(1, length))
        if split_parts(length) > 1:
            shapes.append(WarmShape(1, length, parts=split_parts(length)))
        if recurrent:
            shapes.append(WarmShape(1, length, padded=True))
            if split_parts(length) > 1:  # a long prompt's odd first piece (rows.odd_first), in parts
                shapes.append(WarmShape(1, length, padded=True, parts=split_parts(length)))
    for length in (n for n in lengths if ctx is None or CONTINUED + n <= ctx):
        # a chunk past position 0 (a long prompt's second, or one after a pooled preamble): its
        # attention masks keys padded past the chunk's end, graphs of their own
        shapes.append(WarmShape(1, length, context=CONTINUED, parts=split_parts(CONTINUED + length)))
        if recurrent:
            parts = split_parts(CONTINUED + length)
            shapes.append(WarmShape(1, length, padded=True, context=CONTINUED, parts=parts))
    if prefill_up_to >= LONG_CONTEXT_QUERIES:
        long = LONG_CONTEXT_QUERIES
        shapes += [
            WarmShape(1, long, context=end - long, parts=split_parts(end))
            for end in chunk_ends(long, ctx or 0)
        ]
    return shapes


def chunk_ends(chunk: int, ctx: int) -> list[int]:
    """A `chunk`-token chunk's end in each key bucket past the chunk up to `ctx`'s: one KV block short
    of the bucket (or one position, where the bucket is narrower than a block) where a row holds that
    much, so the keys are padded as serving's usually are. Below SHORT_CONTEXT a new key length may
    change which kernels cuBLAS runs the attention's products with (a graph of new topology); past
    it cuDNN plans per shape."""
    ends = []
    size = bucket(chunk + 2)
    while size <= bucket(ctx):
        short = size - BLOCK if bucket(size - BLOCK) == size else size - 1  # small buckets: < a block
        end = min(short, ctx // BLOCK * BLOCK)
        if end > chunk and not (ends and bucket(ends[-1]) == bucket(end)):  # a later chunk, a new bucket
            ends.append(end)
        size = bucket(size + 1)
    return ends


@dataclass(frozen=True)
class ScratchPass:
    """What a warm-up pass needs of the engine (MlxEngine passes its own methods)."""

    scratch: int  # the scratch slot's index (== the engine's rows)
    table: Callable[[int], np.ndarray]  # the scratch slot's block table, with room for n tokens
    release: Callable[[], None]  # give back the blocks `table` took
    views: Callable[[PassLayout, np.ndarray, mx.array | None], list]
    forward: Callable[[mx.array, list], mx.array]
    outputs: Callable[[], list[mx.array]]  # the caches' arrays the pass writes
    # a chunk's pass in parts, each evaluated apart (prompt_passes.py; engines without it split none)
    in_parts: Callable[[mx.array, list, int], None] | None = None


def run_shape(shape: WarmShape, engine: ScratchPass) -> mx.Dtype | None:
    """One pass of `shape` on the scratch slot, waited for; its tokens are dropped. Returns the
    logits' dtype of a decode pass."""
    table = np.repeat(engine.table(shape.context + shape.length)[None, :], shape.rows, axis=0)
    starts = np.full(shape.rows, shape.context, dtype=np.int64)
    layout = PassLayout(table, starts, shape.length, decode=shape.decode)
    layout.min_splits = shape.splits
    state_rows = np.full(shape.rows, engine.scratch, dtype=np.int64)
    lengths = mx.array([shape.length - 1]) if shape.padded else None
    inputs = mx.zeros((shape.rows, shape.length), dtype=mx.int32)
    mx.eval(inputs)  # apart, as serving's inputs are: the pass's own graphs start at its first kernel
    try:
        if shape.parts > 1:
            assert engine.in_parts is not None
            engine.in_parts(inputs, engine.views(layout, state_rows, lengths), shape.parts)
            return None
        out = engine.forward(inputs, engine.views(layout, state_rows, lengths))
        tokens = [_tokens(out[:, -1, :], shape.sampled)] if shape.decode else []
        mx.eval([*engine.outputs(), *tokens])
        return out.dtype if shape.decode else None
    finally:
        engine.release()


def warm_step_ops(logits_dtype: mx.Dtype, vocab: int) -> None:
    """Run the decode step's ops beside the pass once, on two made-up rows, with the engine's own
    functions: tokens fed in a new order and mixed with host tokens (rows.feed_tokens), a penalty
    history read and written for some rows, logprobs with alternatives, a grammar's mask, a logit bias
    (which turns the logits to float32: both dtypes run)."""
    samplings = [
        Sampling(temperature=0.0, repeat_penalty=1.1, logprobs=2),
        Sampling(seed=1, repeat_penalty=1.1, logprobs=0),
    ]
    batch = make_batch(samplings, [0, 1], vocab)
    history = mx.full((3, PENALTY_WINDOW_MAX), -1, dtype=mx.int32)
    rows = mx.array([2, 0], dtype=mx.int32)
    logprob_rows = LogprobRows.of(samplings)
    bias = bias_table([Sampling(logit_bias=((1, 1.0),)), Sampling()], vocab)
    assert logprob_rows is not None and bias is not None
    outputs = []
    plain = mx.zeros((2, vocab), dtype=logits_dtype)
    words = mx.full((2, (vocab + 31) // 32), -1, dtype=mx.int32)
    for logits in (plain, with_bias(plain, bias)):
        logits = mask_logits(logits, words)
        own = history[rows]
        tokens = sample(logits, batch, mx.zeros((2,), dtype=mx.uint32), own)
        history[rows] = push_history(own, tokens)
        fed = [feed_tokens(tokens, [1, 0], [0, 0]), feed_tokens(tokens, [None, 0], [5, 0])]
        outputs += [*logprob_rows.compute(logits, tokens), *fed]
    mx.eval(history, outputs)


def _tokens(logits: mx.array, sampled: bool) -> mx.array:
    """The pass's tokens as serving draws them (sampling.sample), so its last graphs are the same."""
    rows = logits.shape[0]
    if not sampled:
        return mx.argmax(logits, axis=-1).astype(mx.int32)
    batch = make_batch([Sampling()] * rows, [0] * rows, logits.shape[-1])
    return sample(logits, batch, mx.zeros((rows,), dtype=mx.uint32))


def warm_up(shapes: list[WarmShape], engine: ScratchPass, vocab: int) -> float:
    """Run every shape once; returns the seconds it took (logged)."""
    started = time.perf_counter()
    logits_dtype = None
    for shape in shapes:
        logits_dtype = run_shape(shape, engine) or logits_dtype
    if logits_dtype is not None:
        warm_step_ops(logits_dtype, vocab)
    seconds = time.perf_counter() - started
    log.info("warmed %d pass shapes in %.1f s", len(shapes), seconds)
    return seconds
