"""One row's keys and values copied out of the paged pools into cuDNN's layout by one CUDA kernel.

A long prompt's chunk past SHORT_CONTEXT keys reads its row's whole context as [1, kv heads, width,
dim] arrays (long_context.py). MLX's `take` made them at ~235 GB/s on the H200 (0.26 ms per pool at
30,000 keys, qwen3-0.6b's shape: ~15 ms of a chunk step's device time over 28 layers, keys and values;
`scripts/probe_long_attention.py`): its gather kernel works element by element. Yet each (head, block)
of the row is one contiguous run of BLOCK x dim values in the pool and one in the output, so this kernel
copies those runs whole, 16 bytes a load, one thread block per (head, block) and pool, keys and
values in one launch. Positions at or past the row's end (the key bucket's padding, hidden by the mask) are
written as zeros.

Used when MLX runs on CUDA and a position's values are a whole number of 16-byte words (kernels.py's
`on_cuda_gpu`); elsewhere the `take` serves.
"""

from __future__ import annotations

import mlx.core as mx

_SOURCE = """
    constexpr int WORDS = D * sizeof(k[0]) / 16;  // 16-byte words per position
    const int per_head = gridDim.x / H;           // blocks across the bucket's width
    const int head = blockIdx.x / per_head;
    const int j = blockIdx.x % per_head;
    const int width = per_head * BLOCK;
    const int end = last[0];
    const int blk = j < blocks_shape[0] ? blocks[j] : 0;
    const uint4* src = reinterpret_cast<const uint4*>(blockIdx.y == 0 ? (const void*)k : (const void*)v);
    uint4* dst = reinterpret_cast<uint4*>(blockIdx.y == 0 ? (void*)k_out : (void*)v_out);
    const size_t from = ((size_t)blk * H + head) * BLOCK * WORDS;
    const size_t to = ((size_t)head * width + (size_t)j * BLOCK) * WORDS;
    for (int i = threadIdx.x; i < BLOCK * WORDS; i += blockDim.x) {
        const int pos = j * BLOCK + i / WORDS;
        dst[to + i] = pos < end ? src[from + i] : make_uint4(0u, 0u, 0u, 0u);
    }
"""
THREADS = 256

_kernel = None


def copyable(dim: int, dtype: mx.Dtype) -> bool:
    """A position's values are whole 16-byte words (the kernel's unit of copy)."""
    return (dim * dtype.size) % 16 == 0


def copy_row(
    keys: mx.array, values: mx.array, blocks: mx.array, end: mx.array, heads: int, block: int, width: int
) -> tuple[mx.array, mx.array]:
    """keys / values: the flat pools [pool blocks * heads * block, dim]; blocks: the row's block ids
    (int32, at least ceil(end / block) of them); end: [1] int32, the row's length. Returns its keys and
    values as [1, heads, width, dim] each (`width` a multiple of `block`), zeros past `end`."""
    global _kernel
    if _kernel is None:
        _kernel = mx.fast.cuda_kernel(
            name="kinfer_long_kv_copy",
            input_names=["k", "v", "blocks", "last"],
            output_names=["k_out", "v_out"],
            source=_SOURCE,
        )
    dim = keys.shape[-1]
    k_out, v_out = _kernel(
        inputs=[keys, values, blocks, end],
        template=[("D", dim), ("H", heads), ("BLOCK", block)],
        grid=(THREADS * heads * (width // block), 2, 1),  # x: (head, block) pairs, y: keys, values
        threadgroup=(THREADS, 1, 1),
        output_shapes=[(1, heads, width, dim)] * 2,
        output_dtypes=[keys.dtype, values.dtype],
    )
    return k_out, v_out
