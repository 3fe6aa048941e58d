"""The GatedDeltaNet recurrence (Qwen3.5, Qwen3-Next) as one CUDA kernel per layer and pass.

mlx-lm runs this recurrence with its own Metal kernel on Apple GPUs; everywhere else it falls back to a
Python loop over the sequence, one compiled step per token. On a CUDA GPU that makes a prompt's prefill
cost thousands of small launches per layer, and every decode step a few extra ones. This kernel is a CUDA
port of mlx-lm's Metal kernel (scalar gate; a right-padded pass's padding is masked through the gate,
`hold_state_where_padded`): one warp per (row, value head, value column), its 32 lanes across the key
dimension, the state kept in registers over the whole chunk.

`install_gated_delta_hook` reroutes the `gated_delta_update` that mlx-lm's model modules imported, and
the wrapper uses the kernel only inside `kinfer_pass()` (the MLX engine's own forward passes), so
mlx-lm's own generation in the same process keeps its own code path. The engine says whether its passes
may take the kernel (`kinfer_pass(kernel=...)`, from the `mlx_gated_delta` setting:
`KINFER_MLX_GATED_DELTA=0` turns it off), and whether it may take the kernel compiled once per
instantiation (precompiled.py, the `mlx_precompiled_kernels` setting, off by default) rather than
`mx.fast.cuda_kernel`'s call.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import mlx.core as mx

from kinfer.engines.mlx.cuda_source import kernel_name, kernel_source
from kinfer.engines.mlx.hooks import reroute
from kinfer.engines.mlx.kernels import on_cuda_gpu
from kinfer.engines.mlx.precompiled import PrecompiledKernel, outputs_agree

# the body shared by both paths; `T` (the pass's length) comes from the JIT's shape parameter or as a
# scalar of the precompiled kernel
_BODY = """
    // q, k: [B, T, Hk, Dk]; v, y: [B, T, Hv, Dv]; g, beta: [B, T, Hv]; state: [B, Hv, Dv, Dk]
    constexpr int PT = Dk / 32;
    const int lane = threadIdx.x;
    const int dv = blockIdx.y * blockDim.y + threadIdx.y;
    const int n = blockIdx.z;
    if (dv >= Dv) return;  // a whole warp shares dv: the shuffles below stay full-warp
    const int b = n / Hv;
    const int hv = n % Hv;
    const int hk = hv / (Hv / Hk);

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

_JIT_PROLOGUE = """
    const int T = q_shape[1];
"""
_NAME = "kinfer_gated_delta"
_INPUTS = ("q", "k", "v", "g", "beta", "state_in")

ROWS_PER_BLOCK = 4  # value columns (one warp each) per thread block

_jit = None
_precompiled = PrecompiledKernel("gated delta")
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
def kinfer_pass(*, kernel: bool = True, precompiled: bool = False) -> Iterator[None]:
    """Mark a forward pass as kinfer's: the hooked recurrence may take the kernel inside it (unless
    `kernel` is off), precompiled where it can (unless `precompiled` is off)."""
    outer = getattr(_pass, "kernel", False), getattr(_pass, "precompiled", False)
    _pass.kernel, _pass.precompiled = kernel, precompiled
    try:
        yield
    finally:
        _pass.kernel, _pass.precompiled = outer


@dataclass
class Launch:
    """One instantiation's template list and input dtypes, and its precompiled module once looked up."""

    key: tuple
    dtypes: tuple[mx.Dtype, ...]  # of the inputs q, k, v, g, beta, state
    template: list[tuple[str, mx.Dtype | int]]
    binary: tuple[bytes, str] | None = None
    resolved: bool = False


_launches: dict[tuple, Launch] = {}


def gated_delta_kernel(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    g: mx.array,
    beta: mx.array,
    state: mx.array,
    *,
    precompiled: bool = False,
) -> tuple[mx.array, mx.array]:
    """q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; g, beta [B, T, Hv]; state [B, Hv, Dv, Dk] (float32).
    Returns y [B, T, Hv, Dv] (q's dtype) and the new state. `precompiled`: take the precompiled kernel
    where it is ready and checked."""
    call = launch_for(q, k, v, g, beta, state)
    inputs = (q, k, v, g, beta, state)
    if precompiled:
        binary = resolve_precompiled(call)
        if binary is not None and _precompiled.disabled is None:
            return launch_precompiled(call, binary, inputs)
    return launch_jit(call, inputs)


def launch_for(q, k, v, g, beta, state) -> Launch:
    """The launch parameters of these inputs' instantiation, built on first use."""
    dtypes = (q.dtype, k.dtype, v.dtype, g.dtype, beta.dtype, state.dtype)
    hk, dk = k.shape[2:]
    hv, dv = v.shape[2:]
    key = (*dtypes, dk, dv, hk, hv)
    call = _launches.get(key)
    if call is None:
        template = [("InT", q.dtype), ("StT", state.dtype), ("Dk", dk), ("Dv", dv), ("Hk", hk), ("Hv", hv)]
        call = _launches[key] = Launch(key, dtypes, template)
    return call


def _shapes(call: Launch, batch: int, length: int) -> tuple[list, tuple[int, int, int]]:
    _, _, dk, dv, _, hv = (value for _, value in call.template)
    outputs = [(batch, length, hv, dv), (batch, hv, dv, dk)]
    return outputs, (32, dv, batch * hv)


def launch_jit(call: Launch, inputs: tuple[mx.array, ...]) -> tuple[mx.array, mx.array]:
    """The kernel through mx.fast.cuda_kernel (its source rebuilt by MLX on every call)."""
    global _jit
    if _jit is None:
        _jit = mx.fast.cuda_kernel(
            name=_NAME,
            input_names=list(_INPUTS),
            output_names=["y", "state_out"],
            source=_JIT_PROLOGUE + _BODY,
        )
    batch, length = inputs[1].shape[:2]
    output_shapes, grid = _shapes(call, batch, length)
    y, new_state = _jit(
        inputs=list(inputs),
        template=call.template,
        grid=grid,
        threadgroup=(32, ROWS_PER_BLOCK, 1),
        output_shapes=output_shapes,
        output_dtypes=[call.dtypes[0], call.dtypes[5]],
    )
    return y, new_state


def launch_precompiled(
    call: Launch, binary: tuple[bytes, str], inputs: tuple[mx.array, ...]
) -> tuple[mx.array, mx.array]:
    """The kernel from its compiled module (the inputs made row-contiguous, as the JIT path does)."""
    batch, length = inputs[1].shape[:2]
    output_shapes, grid = _shapes(call, batch, length)
    y, new_state = mx.fast.precompiled_cuda_kernel(
        name=binary[1],
        compiled_source=binary[0],
        inputs=list(inputs),
        output_shapes=output_shapes,
        output_dtypes=[call.dtypes[0], call.dtypes[5]],
        scalars=[length],
        grid=grid,
        threadgroup=(32, ROWS_PER_BLOCK, 1),
        ensure_row_contiguous=True,
    )
    return y, new_state


def precompiled_source(call: Launch, name: str) -> str:
    """The whole CUDA source of one instantiation (cuda_source.py)."""
    return kernel_source(
        name,
        _BODY,
        inputs=list(zip(_INPUTS, call.dtypes, strict=True)),
        outputs=[("y", call.dtypes[0]), ("state_out", call.dtypes[5])],
        scalars=[("T", int)],
        template=call.template,
    )


def resolve_precompiled(call: Launch) -> tuple[bytes, str] | None:
    """The checked precompiled module of this instantiation (compiled and checked on first use), or
    None: the JIT kernel serves it."""
    if not call.resolved:
        name = kernel_name(_NAME, [*call.dtypes, *(value for _, value in call.template[2:])])
        call.binary = _precompiled.binary(
            call.key,
            name,
            lambda: precompiled_source(call, name),
            lambda data, symbol: self_check(call, (data, symbol)),
        )
        call.resolved = True
    return call.binary


def self_check(call: Launch, binary: tuple[bytes, str], batch: int = 2, length: int = 3) -> str | None:
    """Both paths on the same synthetic inputs of this instantiation's shapes: None when they agree."""
    _, _, dk, dv, hk, hv = (value for _, value in call.template)
    keys = mx.random.split(mx.random.key(20), 6)
    q = mx.random.normal((batch, length, hk, dk), key=keys[0]).astype(call.dtypes[0])
    k = mx.random.normal((batch, length, hk, dk), key=keys[1]).astype(call.dtypes[1])
    v = mx.random.normal((batch, length, hv, dv), key=keys[2]).astype(call.dtypes[2])
    g = mx.random.uniform(0.5, 1.0, (batch, length, hv), key=keys[3]).astype(call.dtypes[3])
    beta = mx.random.uniform(0.0, 1.0, (batch, length, hv), key=keys[4]).astype(call.dtypes[4])
    state = mx.random.normal((batch, hv, dv, dk), key=keys[5]).astype(call.dtypes[5])
    inputs = (q, k, v, g, beta, state)
    got, want = launch_precompiled(call, binary, inputs), launch_jit(call, inputs)
    mx.eval(*got, *want)
    return outputs_agree(list(got), list(want))


def _fits(k: mx.array, v: mx.array, a: mx.array, mask: mx.array | None, use_kernel: bool) -> bool:
    dk, hk, hv = k.shape[-1], k.shape[-2], v.shape[-2]
    return (
        getattr(_pass, "kernel", False)
        and use_kernel
        and (mask is None or mask.shape == k.shape[:2])  # [B, T]: a right-padded pass's real positions
        and a.ndim == 3  # a scalar gate per head (a vector gate has a Dk axis)
        and dk % 32 == 0
        and hv % hk == 0
        and kernel_available()
    )


_HOOKED = "_kinfer_gated_delta"


def hold_state_where_padded(g: mx.array, beta: mx.array, mask: mx.array) -> tuple[mx.array, mx.array]:
    """The gate and write strength that leave the state as it was at padded positions (mask False):
    a decay of 1 and a write of 0 make the delta rule's step the identity, which is what mlx-lm's masked
    recurrence does by keeping the old state there. The outputs at those positions are not used."""
    real = mask[..., None]  # [B, T] over the heads of g and beta: [B, T, Hv]
    return mx.where(real, g, mx.array(1, dtype=g.dtype)), mx.where(real, beta, mx.array(0, dtype=beta.dtype))


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
            if mask is not None:
                g, beta = hold_state_where_padded(g, beta, mask)
            if state is None:
                batch, _, _, dk = q.shape
                hv, dv = v.shape[-2:]
                state = mx.zeros((batch, hv, dv, dk), dtype=mx.float32)
            return gated_delta_kernel(
                q, k, v, g, beta, state, precompiled=getattr(_pass, "precompiled", False)
            )

        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(wrapper, _HOOKED, True)
        gated_delta.gated_delta_update = wrapper
    return reroute("gated_delta_update", original, wrapper)
