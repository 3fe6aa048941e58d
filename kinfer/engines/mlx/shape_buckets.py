"""A few shapes instead of every shape, on MLX's CUDA backend.

There a first-seen shape costs the host far more than a step: attention builds a cuDNN graph per exact
shape (~66 ms each, `sdpa_buckets.py`), and a decode pass at a row count not seen before took 240-300 ms
on the H200 for a Qwen3.5-shaped model (new traces and kernels for its compiled layers), where a step
takes ~10 ms. A burst of requests walks the decode batch through every row count from 1 to the batch's
size, and a long prompt's row joining 16 decoding rows stalled them all for 0.3 s; a matrix product of a
new height costs cuBLASLt a new algorithm search (~14 ms a pass for a qwen3-0.6b shape). So on CUDA
the prefill's attention, its passes (token counts and rows: `rows.plan_prefill`, the engine's
`_prefill`) and the decode pass are padded to the sizes below; on a CPU (no such cost) nothing is
padded unless a test forces it (`set_enabled`).
"""

from __future__ import annotations

from kinfer.engines.mlx.kernels import on_cuda_gpu

MIN_BUCKET = 16
STEPS_PER_OCTAVE = 4
EXACT_DECODE_ROWS = 8  # decode batches up to this many rows keep their size (one stream stays one row)

_enabled: bool | None = None  # None: decided on first use (on a CUDA GPU only)


def enabled() -> bool:
    """Whether shapes are padded to buckets: on a CUDA GPU (see the module doc)."""
    global _enabled
    if _enabled is None:
        _enabled = on_cuda_gpu()
    return _enabled


def set_enabled(value: bool | None) -> None:
    """Force the buckets on or off (tests run them on the CPU); None: back to the device's default."""
    global _enabled
    _enabled = value


def _ladder_step(n: int) -> int:
    """The ladder's spacing around n (> MIN_BUCKET): an eighth of the power of two at or above n."""
    top = 1 << (n - 1).bit_length()
    return max(1, top // (2 * STEPS_PER_OCTAVE))


def bucket(n: int) -> int:
    """The smallest size >= n of the ladder 16, 20, 24, 28, 32, 40, 48, ...: four per doubling."""
    if n <= MIN_BUCKET:
        return MIN_BUCKET
    step = _ladder_step(n)
    return -(-n // step) * step


def bucket_floor(n: int) -> int:
    """The largest size <= n of the same ladder (n itself below MIN_BUCKET): a chunk cut to fit."""
    if n <= MIN_BUCKET:
        return n
    step = _ladder_step(n)
    return n // step * step


def compiled_chunk(rows: int) -> bool:
    """Whether a prompt chunk of `rows` rows may run the compiled layers (compiled_step.py,
    compiled_layers.py): with the buckets, one row's, whose ladder lengths the warm-up traces at load. A
    burst's passes of several rows come in too many shapes: each would meet its trace while replies
    stream. Without the buckets a chunk of any length would cost a trace each: none."""
    return enabled() and rows == 1


def row_bucket(n: int) -> int:
    """Rows of a prefill pass: the next power of two."""
    return 1 << (n - 1).bit_length() if n > 1 else 1


def decode_rows(n: int, slots: int) -> int:
    """The decode pass's rows for `n` decoding rows of an engine with `slots` slots (and one scratch
    slot the padding rows point at): n itself up to EXACT_DECODE_ROWS, then the ladder, never past
    every slot plus the scratch one; a full batch past EXACT_DECODE_ROWS takes all of them (one shape,
    no gather). A small engine's full batch keeps its size: one stream of a one-slot engine is a
    one-row pass, whose products MLX's CUDA backend runs on its GEMV kernel (two rows go to cuBLASLt)."""
    if n <= EXACT_DECODE_ROWS:
        return n
    if n >= slots:
        return slots + 1
    return min(bucket(n), slots + 1)
