"""The GatedDeltaNet recurrence (Qwen3.5, Qwen3-Next) as one CUDA kernel per layer and pass.

mlx-lm runs this recurrence with its own Metal kernel on Apple GPUs; everywhere else it falls back to a
Python loop over the sequence, one compiled step per token. On a CUDA GPU that makes a prompt's prefill
cost thousands of small launches per layer, and every decode step a few extra ones. This kernel is a CUDA
port of mlx-lm's Metal kernel (scalar gate, no padding mask): one warp per (row, value head, value
column), its 32 lanes across the key dimension, the state kept in registers over the whole chunk.

`install_gated_delta_hook` reroutes the `gated_delta_update` that mlx-lm's model modules imported, and
the wrapper uses the kernel only inside `kinfer_pass()` (the MLX engine's own forward passes), so
mlx-lm's own generation in the same process keeps its own code path. The engine says whether its passes
may take the kernel (`kinfer_pass(kernel=...)`, from the `mlx_gated_delta` setting:
`KINFER_MLX_GATED_DELTA=0` turns it off).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import mlx.core as mx

from kinfer.engines.mlx.hooks import reroute
from kinfer.engines.mlx.kernels import on_cuda_gpu

_SOURCE = """
    // q, k: [B, T, Hk, Dk]; v, y: [B, T, Hv, Dv]; g, beta: [B, T, Hv]; state: [B, Hv, Dv, Dk]
    constexpr int PT = Dk / 32;
    const int lane = threadIdx.x;
    const int dv = blockIdx.y * blockDim.y + threadIdx.y;
    const int n = blockIdx.z;
    if (dv >= Dv) return;  // a whole warp shares dv: the shuffles below stay full-warp
    const int b = n / Hv;
    const int hv = n % Hv;
    const int hk = hv / (Hv / Hk);
    const int T = q_shape[1];

    const auto* q_ = q + ((size_t)b * T * Hk + hk) * Dk + PT * lane;
    const auto* k_ = k + ((size_t)b * T * Hk + hk) * Dk + PT * lane;
    const auto* v_ = v + ((size_t)b * T * Hv + hv) * Dv + dv;
    auto* y_ = y + ((size_t)b * T * Hv + hv) * Dv + dv;
    const auto* g_ = g + (size_t)b * T * Hv + hv;
    const auto* beta_ = beta + (size_t)b * T * Hv + hv;
    const size_t row = ((size_t)n * Dv + dv) * Dk + PT * lane;

    float st[PT];
    for (int i = 0; i < PT; ++i) st[i] = static_cast<float>(state_in[row + i]);
    for (int t = 0; t < T; ++t) {
        const float decay = static_cast<float>(g_[0]);
        float kv = 0.0f;
        for (int i = 0; i < PT; ++i) {
            st[i] = st[i] * decay;
            kv += st[i] * static_cast<float>(k_[i]);
        }
        for (int o = 16; o > 0; o >>= 1) kv += __shfl_xor_sync(0xffffffff, kv, o);
        const float delta = (static_cast<float>(v_[0]) - kv) * static_cast<float>(beta_[0]);
        float out = 0.0f;
        for (int i = 0; i < PT; ++i) {
            st[i] = st[i] + static_cast<float>(k_[i]) * delta;
            out += st[i] * static_cast<float>(q_[i]);
        }
        for (int o = 16; o > 0; o >>= 1) out += __shfl_xor_sync(0xffffffff, out, o);
        if (lane == 0) y_[0] = static_cast<InT>(out);
        q_ += Hk * Dk;
        k_ += Hk * Dk;
        v_ += Hv * Dv;
        y_ += Hv * Dv;
        g_ += Hv;
        beta_ += Hv;
    }
    for (int i = 0; i < PT; ++i) state_out[row + i] = static_cast<StT>(st[i]);
"""

ROWS_PER_BLOCK = 4  # value columns (one warp each) per thread block

_kernel = None
_cuda: bool | None = None
# per thread (engines are thread-bound): inside one of the MLX engine's own forward passes, whether it
# may take the kernel; outside any pass, never
_pass = threading.local()


def kernel_available() -> bool:
    """The kernel can run on this device (MLX on a CUDA GPU)."""
    global _cuda
    if _cuda is None:
        _cuda = on_cuda_gpu()
    return _cuda


@contextlib.contextmanager
def kinfer_pass(*, kernel: bool = True) -> Iterator[None]:
    """Mark a forward pass as kinfer's: the hooked recurrence may take the kernel inside it (unless
    `kernel` is off)."""
    outer = getattr(_pass, "kernel", False)
    _pass.kernel = kernel
    try:
        yield
    finally:
        _pass.kernel = outer


def gated_delta_kernel(
    q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array, state: mx.array
) -> tuple[mx.array, mx.array]:
    """q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; g, beta [B, T, Hv]; state [B, Hv, Dv, Dk] (float32).
    Returns y [B, T, Hv, Dv] (q's dtype) and the new state."""
    global _kernel
    if _kernel is None:
        _kernel = mx.fast.cuda_kernel(
            name="kinfer_gated_delta",
            input_names=["q", "k", "v", "g", "beta", "state_in"],
            output_names=["y", "state_out"],
            source=_SOURCE,
        )
    batch, length, hk, dk = k.shape
    hv, dv = v.shape[2:]
    y, new_state = _kernel(
        inputs=[q, k, v, g, beta, state],
        template=[("InT", q.dtype), ("StT", state.dtype), ("Dk", dk), ("Dv", dv), ("Hk", hk), ("Hv", hv)],
        grid=(32, dv, batch * hv),
        threadgroup=(32, ROWS_PER_BLOCK, 1),
        output_shapes=[(batch, length, hv, dv), state.shape],
        output_dtypes=[q.dtype, state.dtype],
    )
    return y, new_state


def _fits(k: mx.array, v: mx.array, a: mx.array, mask: mx.array | None, use_kernel: bool) -> bool:
    dk, hk, hv = k.shape[-1], k.shape[-2], v.shape[-2]
    return (
        getattr(_pass, "kernel", False)
        and use_kernel
        and mask is None
        and a.ndim == 3  # a scalar gate per head (a vector gate has a Dk axis)
        and dk % 32 == 0
        and hv % hk == 0
        and kernel_available()
    )


_HOOKED = "_kinfer_gated_delta"


def install_gated_delta_hook() -> int:
    """Reroute `gated_delta_update` in every loaded mlx-lm model module (and in mlx_lm.models.gated_delta
    itself, for modules imported later) through the kernel-aware wrapper. Idempotent; returns how many
    modules use the wrapper."""
    from mlx_lm.models import gated_delta

    current = gated_delta.gated_delta_update
    if getattr(current, _HOOKED, False):
        original, wrapper = current.__wrapped__, current
    else:
        original = current

        def wrapper(q, k, v, a, b, A_log, dt_bias, state=None, mask=None, *, use_kernel=True, **options):
            if options.get("lower_bound") is not None or not _fits(k, v, a, mask, use_kernel):
                return original(q, k, v, a, b, A_log, dt_bias, state, mask, use_kernel=use_kernel, **options)
            beta = mx.sigmoid(b)
            if options.get("allow_neg_eigval"):
                beta = beta * 2.0
            g = gated_delta.compute_g(A_log, a, dt_bias)
            if state is None:
                batch, _, _, dk = q.shape
                hv, dv = v.shape[-2:]
                state = mx.zeros((batch, hv, dv, dk), dtype=mx.float32)
            return gated_delta_kernel(q, k, v, g, beta, state)

        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(wrapper, _HOOKED, True)
        gated_delta.gated_delta_update = wrapper
    return reroute("gated_delta_update", original, wrapper)
