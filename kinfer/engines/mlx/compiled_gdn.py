"""A Qwen3.5 GatedDeltaNet layer's pass as two compiled functions around its recurrence.

mlx-lm's `GatedDeltaNet.__call__` builds ~40 ops per layer and pass in Python. On a one-token pass
(decode), and on one row's unpadded prompt chunk where pass shapes come from a few buckets (CUDA:
compiled_layers.py decides), this runs, with the same maths op for op:

- `before` (compiled): input norm -> the input projections (fused or not, fuse.py) -> the causal
  convolution over the row's saved window and the new tokens -> SiLU -> q / k / v heads -> their L2
  norms; it also returns the new convolution window;
- between them, uncompiled: the window and the recurrent state read from and written to kinfer's
  rows' state (state.StateView) and the recurrence itself (`gated_delta_update`, which kinfer routes to
  its CUDA kernel on a GPU: gated_delta.py);
- `after` (compiled): the gated RMS norm -> output projection + residual, then the layer's SwiGLU
  feed-forward side (compiled_layers.py) in the same function.

Used by compiled_layers.py for layers whose GatedDeltaNet has the known shape; others keep the module
code.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from kinfer.engines.mlx.compiled_step import Group, Projection

INPUTS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")


@dataclass(frozen=True)
class GdnPlan:
    """What the compiled functions need to know of one GatedDeltaNet (equal across the model's)."""

    eps: float  # the input norm's
    inputs: Group
    out: Projection
    k_heads: int
    v_heads: int
    k_dim: int
    v_dim: int
    kernel: int  # convolution width
    norm_eps: float  # the gated norm's


def gdn_plan(layer: nn.Module) -> tuple[GdnPlan, dict] | None:
    """The plan and arrays of `layer`'s GatedDeltaNet, or None where it is not the known shape."""
    gdn, norm = layer.get("linear_attn"), layer.get("input_layernorm")
    if gdn is None or type(gdn).__name__ != "GatedDeltaNet" or type(norm) is not nn.RMSNorm:
        return None
    if getattr(gdn, "sharding_group", None) is not None or type(gdn.conv1d) is not nn.Conv1d:
        return None
    conv = gdn.conv1d
    if "bias" in conv or conv.stride != 1 or conv.padding != 0 or conv.dilation != 1:
        return None
    if conv.groups != gdn.conv_dim or type(gdn.norm).__name__ != "Qwen3NextRMSNormGated":
        return None
    inputs, out = Group.of(gdn, INPUTS), Projection.of(gdn.get("out_proj"))
    if inputs is None or out is None:
        return None
    plan = GdnPlan(
        eps=norm.eps,
        inputs=inputs[0],
        out=out,
        k_heads=gdn.num_k_heads,
        v_heads=gdn.num_v_heads,
        k_dim=gdn.head_k_dim,
        v_dim=gdn.head_v_dim,
        kernel=gdn.conv_kernel_size,
        norm_eps=gdn.norm.eps,
    )
    arrays = {
        "ln": norm.weight,
        "inputs": inputs[1],
        "conv": conv.weight,
        "norm": gdn.norm.weight,
        "out": Projection.arrays(gdn.out_proj),
    }
    return plan, arrays


def make_before(plan: GdnPlan):
    from mlx_lm.models.gated_delta import normalize_qk

    key_dim = plan.k_heads * plan.k_dim

    def before(x: mx.array, window: mx.array, w: dict) -> tuple[mx.array, ...]:
        batch, length, _ = x.shape
        qkv, z, b, a = plan.inputs(mx.fast.rms_norm(x, w["ln"], plan.eps), w["inputs"])
        z = z.reshape(batch, length, plan.v_heads, plan.v_dim)
        conv_input = mx.concatenate([window, qkv], axis=1)
        window = mx.contiguous(conv_input[:, -(plan.kernel - 1) :, :])
        conv_out = nn.silu(mx.conv1d(conv_input, w["conv"], 1, 0, 1, conv_input.shape[-1]))
        q, k, v = mx.split(conv_out, [key_dim, 2 * key_dim], -1)
        q = q.reshape(batch, length, plan.k_heads, plan.k_dim)
        k = k.reshape(batch, length, plan.k_heads, plan.k_dim)
        v = v.reshape(batch, length, plan.v_heads, plan.v_dim)
        q, k = normalize_qk(q, k, inv_scale=plan.k_dim**-0.5, eps=1e-6)
        return window, q, k, v, a, b, z

    return before


def gated_norm_out(plan: GdnPlan, x: mx.array, out: mx.array, z: mx.array, w: dict) -> mx.array:
    """x + out_proj(gated RMS norm of the recurrence's output), as mlx-lm's layer computes it."""
    from mlx_lm.models.activations import precise_swiglu

    normed = precise_swiglu(out, z, mx.fast.rms_norm(out, w["norm"], plan.norm_eps))
    return plan.out.add_to(x, normed.reshape(*x.shape[:2], -1), w["out"])


def linear_decode(layer: nn.Module, x: mx.array, cache, side) -> mx.array | None:
    """The layer's pass (one token, or an unpadded prompt chunk) through `side`'s compiled functions;
    None where this pass cannot (no saved window yet): the caller runs the module code."""
    window = cache[0] if cache is not None else None
    if window is None:
        return None
    from mlx_lm.models import qwen3_5

    gdn, w = layer.linear_attn, layer._kinfer_arrays
    window, q, k, v, a, b, z = side.before(x, window, w["gdn"])
    cache[0] = window
    out, state = qwen3_5.gated_delta_update(
        q, k, v, a, b, gdn.A_log, gdn.dt_bias, cache[1], None, use_kernel=not gdn.training
    )
    cache[1] = state
    cache.advance(x.shape[1])
    return side.after(x, out, z, w)
