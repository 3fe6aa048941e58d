"""Qwen3.5's decoder layers as compiled functions on one-token passes (and on bucketed prompt chunks),
for models whose whole decode pass compiled_step.py cannot take over (GatedDeltaNet layers between
gated attention ones).

Each layer's pass becomes two compiled functions around what must stay uncompiled (kinfer's state slots
and recurrence kernel: compiled_gdn.py; the paged KV write and attention: compiled_gated_attn.py), the
second ending in the layer's SwiGLU feed-forward side `h + mlp(norm(h))`. A layer whose mixer is of
another shape still gets that feed-forward side compiled after mlx-lm's mixer code. Functions are shared
by every layer of one configuration (the weights are arguments) and run on one-token (decode) passes,
and on one row's prompt chunks where pass shapes come from a few buckets (CUDA: shape_buckets.py; the
warm-up traces those lengths at load, where any other chunk would meet its trace while replies stream):
there a long prompt's pass beside decoding rows took ~4x a decode step, all of it host time building and
encoding the module code's ops. A GatedDeltaNet's padded pass (rows ending early) keeps mlx-lm's masked
graph. The layer objects get a kinfer subclass of their own class (the class itself is untouched; other
models and mlx-lm's generators see no change). `compile_decode` picks, per model, the whole compiled
pass (compiled_step.py) or these layers.
"""

from __future__ import annotations

import logging

import mlx.core as mx
import mlx.nn as nn

from kinfer.engines.mlx import shape_buckets
from kinfer.engines.mlx.compiled_gated_attn import GatedAttnPlan, attention_decode, gated_attn_plan, gated_out
from kinfer.engines.mlx.compiled_gated_attn import make_before as make_attn_before
from kinfer.engines.mlx.compiled_gdn import GdnPlan, gated_norm_out, gdn_plan, linear_decode, make_before
from kinfer.engines.mlx.compiled_step import CompiledDecoder, Group, Projection, same_rope
from kinfer.engines.mlx.kv import PagedKV
from kinfer.engines.mlx.state import StateView

log = logging.getLogger(__name__)

# model_type -> the decoder layer class (module, name) whose __call__ is `x + mixer(norm(x))`, then
# `h + mlp(post_attention_layernorm(h))`, the mixer `linear_attn` where `is_linear`, else `self_attn`
LAYERS = {"qwen3_5": ("mlx_lm.models.qwen3_5", "DecoderLayer")}

_subclasses: dict[type, type] = {}


class _OutputSide:
    """The compiled `h + mlp(norm(h))` of layers sharing one configuration; with `gdn`, also the two
    compiled halves of their GatedDeltaNet's one-token pass (compiled_gdn.py), the second ending in
    the feed-forward side."""

    def __init__(
        self,
        eps: float,
        gate_up: Group,
        down: Projection,
        gdn: GdnPlan | None,
        attn: GatedAttnPlan | None,
        rope: nn.Module | None,
    ) -> None:
        from mlx_lm.models.activations import swiglu

        def feed_forward(h: mx.array, w: dict) -> mx.array:
            gate, up = gate_up(mx.fast.rms_norm(h, w["post"], eps), w["gate_up"])
            return down.add_to(h, swiglu(gate, up), w["down"])

        def after(x: mx.array, out: mx.array, z: mx.array, w: dict) -> mx.array:
            assert gdn is not None
            return feed_forward(gated_norm_out(gdn, x, out, z, w["gdn"]), w)

        self.call = mx.compile(lambda x, mixed, w: feed_forward(x + mixed, w))
        self.before = None if gdn is None else mx.compile(make_before(gdn))
        self.after = None if gdn is None else mx.compile(after)

        def attn_after(x: mx.array, attended: mx.array, gate: mx.array, w: dict) -> mx.array:
            assert attn is not None
            return feed_forward(gated_out(attn, x, attended, gate, w["attn"]), w)

        self.chunks = True  # one row's prompt chunks too, where shapes are bucketed (off: check.py)
        self.attn_plan, self.rope = attn, rope
        self.attn_before = None if attn is None else mx.compile(make_attn_before(attn, rope))
        self.attn_after = None if attn is None else mx.compile(attn_after)


def _decode_call(self, x: mx.array, mask: mx.array | None = None, cache=None) -> mx.array:
    side = self._kinfer_side
    if x.shape[1] != 1 and not _compiled_chunk(x, cache, side):
        return super(type(self), self).__call__(x, mask, cache)
    if self.is_linear and side.before is not None and mask is None:  # a padded pass: the masked graph
        out = linear_decode(self, x, cache, side)
        if out is not None:
            return out
    if not self.is_linear and side.attn_before is not None:
        out = attention_decode(self, x, cache, side)
        if out is not None:
            return out
    mixer = self.linear_attn if self.is_linear else self.self_attn
    mixed = mixer(self.input_layernorm(x), mask, cache)
    return self._kinfer_side.call(x, mixed, self._kinfer_arrays)


def _compiled_chunk(x: mx.array, cache, side: _OutputSide) -> bool:
    """A prompt chunk that runs the compiled functions: one `shape_buckets.compiled_chunk` allows, on
    kinfer's caches (a prompt on mlx-lm's own, the load-time check's reference, keeps mlx-lm's code)."""
    kinfers = isinstance(cache, (PagedKV, StateView))
    return kinfers and side.chunks and shape_buckets.compiled_chunk(x.shape[0])


def _side(sides: dict, eps, gate_up, down, gdn, attn, rope) -> _OutputSide:
    """The side object of this configuration, shared with earlier layers of the same one (and the same
    RoPE, which the compiled attention closes over)."""
    key = (eps, gate_up, down, gdn, attn)
    for side in sides.setdefault(key, []):
        if rope is None or (side.rope is not None and same_rope(side.rope, rope)):
            return side
    side = _OutputSide(eps, gate_up, down, gdn, attn, rope)
    sides[key].append(side)
    return side


def _subclass(cls: type) -> type:
    found = _subclasses.get(cls)
    if found is None:
        found = _subclasses[cls] = type(f"Compiled{cls.__name__}", (cls,), {"__call__": _decode_call})
    return found


def install(model: nn.Module, model_type: str) -> int:
    """Give every layer of the known pattern the compiled output side; returns how many got it."""
    known = LAYERS.get(model_type)
    if known is None:
        return 0
    sides: dict[tuple, list[_OutputSide]] = {}
    done = 0
    for layer in model.layers:
        cls = type(layer)
        norm = layer.get("post_attention_layernorm")
        if (cls.__module__, cls.__name__) != known or type(norm) is not nn.RMSNorm:
            continue
        mlp = layer.get("mlp")
        gate_up = Group.of(mlp, ("gate_proj", "up_proj")) if mlp is not None else None
        down = Projection.of(mlp.get("down_proj")) if mlp is not None else None
        if type(mlp).__name__ != "Qwen3NextMLP" or gate_up is None or down is None:
            continue  # a mixture of experts, or sharded projections: the module code
        gdn = gdn_plan(layer) if layer.is_linear else None
        attn = None if layer.is_linear else gated_attn_plan(layer)
        side = _side(sides, norm.eps, gate_up[0], down, gdn and gdn[0], attn and attn[0], attn and attn[2])
        arrays = {"post": norm.weight, "gate_up": gate_up[1], "down": Projection.arrays(mlp.down_proj)}
        if gdn is not None:
            arrays["gdn"] = gdn[1]
        if attn is not None:
            arrays["attn"] = attn[1]
        mx.eval(arrays)  # the transposed weights: views of the same memory
        object.__setattr__(layer, "_kinfer_side", side)
        object.__setattr__(layer, "_kinfer_arrays", arrays)
        layer.__class__ = _subclass(cls)
        done += 1
    log.debug("compiled output side on %d of %d layers", done, len(model.layers))
    return done


def set_chunks(model: nn.Module, on: bool) -> bool:
    """One row's prompt chunks through the compiled functions (`on`) or the module code, one-token
    passes left compiled either way; whether any were on."""
    sides = {id(side): side for layer in model.layers if (side := getattr(layer, "_kinfer_side", None))}
    were = any(side.chunks for side in sides.values())
    for side in sides.values():
        side.chunks = on
    return were


def uninstall(model: nn.Module) -> int:
    """Give the layers their own class back (the module code); returns how many had the compiled side."""
    undone = 0
    for layer in model.layers:
        if type(layer) in _subclasses.values():
            layer.__class__ = type(layer).__mro__[1]
            undone += 1
    return undone


def compile_decode(model: nn.Module, model_type: str) -> CompiledDecoder | None:
    """The whole decode pass compiled where compiled_step.py knows the model (returned); else the
    compiled output side of each layer of the known pattern here (None returned)."""
    decoder = CompiledDecoder.wrap(model, model_type)
    if decoder is None:
        install(model, model_type)
    return decoder
