"""The GatedDeltaNet recurrence: kinfer's CUDA kernel agrees with mlx-lm's step-by-step reference, and the
hook that routes to it touches only kinfer's own forward passes.

The kernel tests run only where MLX has a CUDA GPU (the H200 benchmark machine).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from kinfer.engines.mlx import blas  # noqa: F401
from kinfer.engines.mlx.gated_delta import (
    gated_delta_kernel,
    hold_state_where_padded,
    install_gated_delta_hook,
    kernel_available,
    kinfer_pass,
)

cuda = pytest.mark.skipif(not kernel_available(), reason="the kernel exists only for MLX on CUDA")


def _inputs(batch=3, length=7, hk=2, hv=4, dk=128, dv=128, dtype=mx.bfloat16, seed=0):
    from mlx_lm.models.gated_delta import normalize_qk

    rng = np.random.default_rng(seed)

    def rand(*shape):
        return mx.array(rng.standard_normal(shape).astype(np.float32))

    q, k = normalize_qk(
        rand(batch, length, hk, dk), rand(batch, length, hk, dk), inv_scale=dk**-0.5, eps=1e-6
    )
    v = rand(batch, length, hv, dv)
    a, b = rand(batch, length, hv), rand(batch, length, hv)
    a_log, dt_bias = rand(hv), rand(hv)
    state = rand(batch, hv, dv, dk) * 0.1
    return [x.astype(dtype) for x in (q, k, v, a, b)] + [a_log, dt_bias, state]


def test_the_hook_reroutes_model_modules_and_is_idempotent():
    from mlx_lm.models import gated_delta, qwen3_5

    install_gated_delta_hook()
    assert install_gated_delta_hook() >= 1
    assert qwen3_5.gated_delta_update is gated_delta.gated_delta_update
    assert getattr(qwen3_5.gated_delta_update, "__wrapped__", None) is not None


def test_outside_a_kinfer_pass_the_wrapper_is_mlx_lm_itself():
    from mlx_lm.models import gated_delta

    install_gated_delta_hook()
    wrapper = gated_delta.gated_delta_update
    args = _inputs(dtype=mx.float32)
    y, state = wrapper(*args)
    y_ref, state_ref = wrapper.__wrapped__(*args)
    assert mx.array_equal(y, y_ref) and mx.array_equal(state, state_ref)
    with kinfer_pass():  # on a CPU the kernel is not there: still mlx-lm's code
        y_cpu, _ = wrapper(*args)
    if not kernel_available():
        assert mx.array_equal(y_cpu, y_ref)


def _right_padding(batch: int, length: int) -> mx.array:
    """[batch, length] True at real positions: row i has length - 2 * i of them."""
    return mx.arange(length)[None, :] < mx.array([length - 2 * i for i in range(batch)])[:, None]


def test_padding_held_through_the_gate_is_mlx_lm_s_masked_recurrence():
    # the unmasked recurrence with a decay of 1 and a write of 0 at padded positions leaves the state
    # exactly where mlx-lm's masked recurrence keeps it (what lets the CUDA kernel take padded passes)
    from mlx_lm.models.gated_delta import compute_g, gated_delta_ops

    q, k, v, a, b, a_log, dt_bias, state = _inputs(length=9, dtype=mx.float32)
    g, beta, mask = compute_g(a_log, a, dt_bias), mx.sigmoid(b), _right_padding(3, 9)
    _, held = gated_delta_ops(q, k, v, *hold_state_where_padded(g, beta, mask), state)
    _, masked = gated_delta_ops(q, k, v, g, beta, state, mask)
    assert mx.array_equal(held, masked)
    # and a row's state after its real positions is the state of a pass without its padding
    _, alone = gated_delta_ops(q[2:, :5], k[2:, :5], v[2:, :5], g[2:, :5], beta[2:, :5], state[2:])
    assert mx.allclose(held[2:], alone, atol=1e-6)


@cuda
def test_the_kernel_takes_a_right_padded_pass_like_mlx_lm_s_masked_recurrence():
    from mlx_lm.models import gated_delta

    install_gated_delta_hook()
    wrapper = gated_delta.gated_delta_update
    args = _inputs(length=20)
    mask = _right_padding(3, 20)
    with kinfer_pass():
        _, state = wrapper(*args, mask)
    _, state_ref = wrapper.__wrapped__(*args, mask)
    assert float(mx.abs(state - state_ref).max()) < 1e-3 * (1 + float(mx.abs(state_ref).max()))


@cuda
@pytest.mark.parametrize("length", [1, 7, 130])
@pytest.mark.parametrize("heads", [(2, 4, 128, 128), (16, 16, 128, 128), (1, 2, 64, 96)])
def test_kernel_matches_mlx_lm_step_by_step(length, heads):
    from mlx_lm.models.gated_delta import compute_g, gated_delta_ops

    hk, hv, dk, dv = heads
    q, k, v, a, b, a_log, dt_bias, state = _inputs(length=length, hk=hk, hv=hv, dk=dk, dv=dv)
    g, beta = compute_g(a_log, a, dt_bias), mx.sigmoid(b)
    y, new_state = gated_delta_kernel(q, k, v, g, beta, state)
    y_ref, state_ref = gated_delta_ops(q, k, v, g, beta, state)
    assert y.shape == y_ref.shape and y.dtype == mx.bfloat16 and new_state.dtype == mx.float32
    scale = float(mx.abs(y_ref.astype(mx.float32)).max())
    assert float(mx.abs(y.astype(mx.float32) - y_ref.astype(mx.float32)).max()) < 2e-2 * scale
    assert float(mx.abs(new_state - state_ref).max()) < 1e-3 * (1 + float(mx.abs(state_ref).max()))


@cuda
def test_inside_a_kinfer_pass_the_wrapper_takes_the_kernel_and_agrees():
    from mlx_lm.models import gated_delta

    install_gated_delta_hook()
    wrapper = gated_delta.gated_delta_update
    args = _inputs(length=20)
    with kinfer_pass():
        y, state = wrapper(*args)
    y_ref, state_ref = wrapper.__wrapped__(*args)
    assert float(mx.abs(y.astype(mx.float32) - y_ref.astype(mx.float32)).max()) < 2e-2 * float(
        mx.abs(y_ref.astype(mx.float32)).max()
    )
    assert float(mx.abs(state - state_ref).max()) < 1e-3 * (1 + float(mx.abs(state_ref).max()))


@cuda
def test_a_kinfer_pass_with_the_kernel_off_stays_on_mlx_lm():
    # what --mlx-gated-delta off (KINFER_MLX_GATED_DELTA=0) makes the engine's passes do
    from mlx_lm.models import gated_delta

    install_gated_delta_hook()
    wrapper = gated_delta.gated_delta_update
    args = _inputs(length=20)
    with kinfer_pass(kernel=False):
        y, state = wrapper(*args)
    y_ref, state_ref = wrapper.__wrapped__(*args)
    assert mx.array_equal(y, y_ref) and mx.array_equal(state, state_ref)


@cuda
@pytest.mark.parametrize("length", [1, 130])
def test_the_precompiled_kernel_is_taken_and_agrees_with_the_jit_kernel(length):
    from mlx_lm.models.gated_delta import compute_g

    from kinfer.engines.mlx import gated_delta
    from kinfer.engines.mlx.precompiled import outputs_agree

    q, k, v, a, b, a_log, dt_bias, state = _inputs(length=length, hk=16, hv=16)
    inputs = (q, k, v, compute_g(a_log, a, dt_bias), mx.sigmoid(b), state)
    call = gated_delta.launch_for(*inputs)
    binary = gated_delta.resolve_precompiled(call)
    assert binary is not None, gated_delta._precompiled.disabled
    got = gated_delta.launch_precompiled(call, binary, inputs)
    want = gated_delta.launch_jit(call, inputs)
    assert outputs_agree(list(got), list(want)) is None  # the same bits, or one rounding apart
    on = gated_delta_kernel(*inputs, precompiled=True)  # --mlx-precompiled-kernels on
    assert mx.array_equal(on[0], got[0]) and mx.array_equal(on[1], got[1])
