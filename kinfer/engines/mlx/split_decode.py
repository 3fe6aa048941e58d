"""Decode attention for long rows: a row's positions split over several thread blocks, then merged.

The fused kernel (kernels.py) gives a row one thread block per KV head, and that block walks every
position the row attends to. For a row 50,000 positions long that is a long serial walk on a few of
the GPU's SMs: on the H200 (qwen3.5-0.8b shape, 2 KV heads), once a 50,000-token prompt had joined 16
decoding rows, every decode step waited 24-34 ms for the GPU, against ~9 ms before. Flash-decoding's
answer, here: cut each row's positions into spans, one thread block per (row, KV head, span), each
leaving its partial softmax (its maximum, its sum and its unnormalized output); a second kernel
merges each row's spans.

A pass takes this path only while its longest row attends to more than SPLIT_FROM positions: the
second launch costs ~17-20 us of GPU time per layer, which the walk it cuts short pays back only past
~16,000 positions (H200, `scripts/bench_split_decode.py`, one layer's attention, 1 row: qwen3-0.6b
shape 44 -> 57 us at 16,384 positions, 235 -> 128 at 50,000, 803 -> 209 at 100,000; qwen3.5-0.8b shape
54 -> 45, 327 -> 87, 1,186 -> 143). The
number of spans is the grid's depth, a power of two up to MAX_SPLITS, not a template parameter: a new
count compiles no kernel, and MLX's CUDA graphs, keyed by topology, are updated rather than built
again. A span is never shorter than MIN_SPAN positions, so a short row beside a long one takes few
blocks and the rest return at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from kinfer.engines.mlx.kernels import HEAD, WALK, WARPS_MERGED, Launch

SPLIT_FROM = 16384  # a pass splits its rows once one attends to more positions than this
SPAN = 1024  # positions a block walks, as near as a power-of-two count of spans gets
MAX_SPLITS = 64  # blocks per (row, KV head) at most: past 64K positions the spans grow instead
MIN_SPAN = 256  # positions a block walks at least (a short row beside a long one takes few blocks)

_SPLIT_BOUNDS = """    const int split = blockIdx.z;
    const int splits = gridDim.z;
    const int first = bounds[2 * row];
    const int end = bounds[2 * row + 1];
    const int span = max(MIN_SPAN, (end - first + splits - 1) / splits);
    const int lo = first + split * span;
    const int hi = min(end, lo + span);
"""

# each warp leaves some of the G heads' partial results: unnormalized output, maximum and sum
_SPLIT_FINISH = (
    WARPS_MERGED[1:]
    + """        const size_t at = ((size_t)(row * HKV + kvh) * splits + split) * G + g;
        float* pp = part + at * DV + lane * PV;
        for (int i = 0; i < PV; ++i) {
            float o = 0.0f;
            for (int w = 0; w < NW; ++w) o += sacc[w][g][lane * PV + i] * wt[w];
            pp[i] = o;
        }
        if (lane == 0) {
            ml[2 * at] = top;
            ml[2 * at + 1] = total;
        }
    }
"""
)

# one warp per (row, query head): the spans' partial results rescaled to their common maximum
_MERGE = """
    const float NEG_INF = __int_as_float(0xff800000);
    constexpr int PV = DV / 32;
    const int lane = threadIdx.x;
    const int head = blockIdx.y;  // (row * HKV + kvh) * G + g
    const int pair = head / G;
    const int g = head % G;
    const int splits = ml_shape[2];
    float top = NEG_INF;
    for (int s = 0; s < splits; ++s) top = fmaxf(top, ml[2 * (((size_t)pair * splits + s) * G + g)]);
    float total = 0.0f;
    float o[PV];
    for (int i = 0; i < PV; ++i) o[i] = 0.0f;
    for (int s = 0; s < splits; ++s) {
        const size_t at = ((size_t)pair * splits + s) * G + g;
        const float m = ml[2 * at];
        if (m == NEG_INF) continue;  // an empty span: its output was never written
        const float w = __expf(m - top);
        total += ml[2 * at + 1] * w;
        const float* pp = part + at * DV + lane * PV;
        for (int i = 0; i < PV; ++i) o[i] += pp[i] * w;
    }
    T* op = out + (size_t)head * DV + lane * PV;
    for (int i = 0; i < PV; ++i) op[i] = static_cast<T>(o[i] / total);
"""

_spans = None
_merge = None


def splits_for(longest: int) -> int:
    """Blocks per (row, KV head) for a pass whose longest row attends to `longest` positions: 1 (the
    fused kernel alone) up to SPLIT_FROM, then the power of two that keeps a span near SPAN."""
    if longest <= SPLIT_FROM:
        return 1
    splits = 2
    while splits < MAX_SPLITS and splits * SPAN < longest:
        splits *= 2
    return splits


@dataclass(frozen=True)
class SplitShape:
    """The partial results' shapes of one pass: [batch, KV heads, splits, G, DV] and [..., 2]."""

    batch: int
    kv_heads: int
    splits: int
    group: int
    dim_v: int

    @property
    def part(self) -> tuple[int, ...]:
        return (self.batch, self.kv_heads, self.splits, self.group, self.dim_v)

    @property
    def ml(self) -> tuple[int, ...]:
        return (self.batch, self.kv_heads, self.splits, self.group, 2)


def split_decode_attention(call: Launch, inputs: tuple[mx.array, ...], splits: int) -> mx.array:
    """The fused kernel's attention (same inputs, same output) with each row's positions cut into
    `splits` spans walked by their own blocks, then merged."""
    global _spans, _merge
    if _spans is None:
        _spans = mx.fast.cuda_kernel(
            name="kinfer_paged_decode_spans",
            input_names=["q", "k", "v", "tables", "bounds", "scale"],
            output_names=["part", "ml"],
            source="\n    const int width = tables_shape[1];\n    const float sc = scale[0];\n"
            + HEAD
            + _SPLIT_BOUNDS
            + WALK
            + _SPLIT_FINISH,
        )
        _merge = mx.fast.cuda_kernel(
            name="kinfer_paged_decode_merge",
            input_names=["part", "ml"],
            output_names=["out"],
            source=_MERGE,
        )
    queries = inputs[0]
    batch = queries.shape[0]
    group = call.q_heads // call.kv_heads
    shape = SplitShape(batch, call.kv_heads, splits, group, call.dim_v)
    part, ml = _spans(
        inputs=[*inputs, call.scale_array],
        template=[*call.template, ("MIN_SPAN", MIN_SPAN)],
        grid=(32 * call.warps, batch * call.kv_heads, splits),
        threadgroup=call.threadgroup,
        output_shapes=[shape.part, shape.ml],
        output_dtypes=[mx.float32, mx.float32],
    )
    (out,) = _merge(
        inputs=[part, ml],
        template=[("T", queries.dtype), ("DV", call.dim_v), ("G", group)],
        grid=(32, batch * call.q_heads, 1),
        threadgroup=(32, 1, 1),
        output_shapes=[(batch, call.q_heads, 1, call.dim_v)],
        output_dtypes=[queries.dtype],
    )
    return out
