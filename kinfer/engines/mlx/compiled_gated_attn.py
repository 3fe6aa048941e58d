"""A Qwen3.5 full-attention layer's pass as two compiled functions around kinfer's paged attention.

Qwen3-Next-style attention (`Qwen3NextAttention`) gates its output: q_proj yields each head's query and
a gate; the output is `o_proj(attention * sigmoid(gate))`. On a one-token pass, and on one row's
prompt chunk where pass shapes are bucketed (compiled_layers.py decides), this runs, with mlx-lm's
maths op for op:

- `before` (compiled): input norm -> q(+gate) / k / v projections -> q/k norms -> RoPE;
- between them, uncompiled: the paged KV write and attention (kv.PagedKV);
- `after` (compiled): the gate, output projection + residual, then the layer's SwiGLU feed-forward
  side (compiled_layers.py) in the same function.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from kinfer.engines.mlx.compiled_step import Group, Projection
from kinfer.engines.mlx.kv import PagedKV


@dataclass(frozen=True)
class GatedAttnPlan:
    eps: float  # every norm's (input, q, k)
    heads: int
    kv_heads: int
    scale: float
    qkv: Group
    out: Projection


def gated_attn_plan(layer: nn.Module) -> tuple[GatedAttnPlan, dict, nn.Module] | None:
    """The plan, arrays and RoPE module of `layer`'s attention, or None where it is not the known shape."""
    attn, norm = layer.get("self_attn"), layer.get("input_layernorm")
    if attn is None or type(attn).__name__ != "Qwen3NextAttention" or type(norm) is not nn.RMSNorm:
        return None
    norms = (norm, attn.get("q_norm"), attn.get("k_norm"))
    if any(type(n) is not nn.RMSNorm for n in norms) or len({n.eps for n in norms}) != 1:
        return None
    qkv, out = Group.of(attn, ("q_proj", "k_proj", "v_proj")), Projection.of(attn.get("o_proj"))
    if qkv is None or out is None:
        return None
    plan = GatedAttnPlan(
        norm.eps, attn.num_attention_heads, attn.num_key_value_heads, attn.scale, qkv[0], out
    )
    arrays = {
        "ln": norm.weight,
        "qkv": qkv[1],
        "qn": attn.q_norm.weight,
        "kn": attn.k_norm.weight,
        "o": Projection.arrays(attn.o_proj),
    }
    return plan, arrays, attn.rope


def make_before(plan: GatedAttnPlan, rope: nn.Module):
    def before(x: mx.array, offsets: mx.array, w: dict) -> tuple[mx.array, ...]:
        batch, length, _ = x.shape
        q_out, k, v = plan.qkv(mx.fast.rms_norm(x, w["ln"], plan.eps), w["qkv"])
        queries, gate = mx.split(q_out.reshape(batch, length, plan.heads, -1), 2, axis=-1)
        gate = gate.reshape(batch, length, -1)
        queries = mx.fast.rms_norm(queries, w["qn"], plan.eps).transpose(0, 2, 1, 3)
        keys = mx.fast.rms_norm(k.reshape(batch, length, plan.kv_heads, -1), w["kn"], plan.eps)
        values = v.reshape(batch, length, plan.kv_heads, -1).transpose(0, 2, 1, 3)
        keys = keys.transpose(0, 2, 1, 3)
        return rope(queries, offset=offsets), rope(keys, offset=offsets), values, gate

    return before


def gated_out(plan: GatedAttnPlan, x: mx.array, attended: mx.array, gate: mx.array, w: dict) -> mx.array:
    """x + o_proj(attention * sigmoid(gate)), as mlx-lm's layer computes it."""
    batch, length, _ = x.shape
    attended = attended.transpose(0, 2, 1, 3).reshape(batch, length, -1)
    return plan.out.add_to(x, attended * mx.sigmoid(gate), w["o"])


def attention_decode(layer: nn.Module, x: mx.array, cache, side) -> mx.array | None:
    """The layer's pass (one token or a prompt chunk) through `side`'s compiled functions; None where
    the cache is not kinfer's paged one (the caller runs the module code)."""
    if not isinstance(cache, PagedKV):
        return None
    w = layer._kinfer_arrays
    q, k, v, gate = side.attn_before(x, cache.layout.offsets, w["attn"])
    cache.update_and_fetch(k, v)
    attended = cache.attend(q, k, v, scale=side.attn_plan.scale)
    return side.attn_after(x, attended, gate, w)
