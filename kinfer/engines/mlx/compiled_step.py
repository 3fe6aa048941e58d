"""A compiled decode pass for llama-style decoder layers (issue 20): less Python and fewer ops per step.

On a GPU the MLX engine's decode step is all host time: Python walking mlx-lm's modules op by op to
build the graph, then MLX encoding it primitive by primitive. This module runs the decode pass of the
architectures it knows (`ARCHITECTURES`) as a few `mx.compile`d functions instead of the module code:

- `first`: input norm -> q/k/v projection(s) -> q/k norms -> RoPE of layer 0;
- `step` (once per layer boundary): output projection + residual -> norm -> gate/up -> SwiGLU -> down
  + residual of layer i, then the input side of layer i + 1 (as `first`);
- `last`: the last layer's output side, the final norm and the LM head.

Between them, uncompiled, each layer writes its new keys and values to its paged cache and attends
(kv.PagedKV: scatters and the custom kernels stay outside any compiled function). A compiled function
is traced once per input shape (here: per row count) and replayed from C++ afterwards, with its
elementwise chains fused into single kernels. The weights are arguments, not captured constants, so
every layer shares one trace (a new row count costs three traces, not three per layer). On CUDA,
where pass shapes come from a few buckets (shape_buckets.py), one row's prompt chunks take the same
functions (the engine's `forward`; the warm-up traces their lengths at load): a long prompt's pass is
host time too, and builds ~45 % fewer primitives this way (scripts/probe_prefill_ops.py).

The maths is mlx-lm's own (RMSNorm, the model's own RoPE module, SwiGLU, projections fused or not by
fuse.py, quantized or not) with fewer primitives: dense weights go in as their evaluated transposes
(views of the same memory), a residual add rides its product (`addmm`: the same float32 result here,
one rounding fewer in bf16; on CUDA one row's is a product and an add, `one_row_apart`), and
one-position heads are reshaped without transposes. Greedy tokens
match the uncompiled pass (tests/engines/mlx/test_compiled_step.py); a model whose layers differ
from that pattern (sliding windows, other MLPs, unknown layer classes) keeps mlx-lm's modules.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import mlx.core as mx
import mlx.nn as nn

from kinfer.engines.mlx import shape_buckets
from kinfer.engines.mlx.fuse import FusedPart
from kinfer.engines.mlx.kernels import on_cuda_gpu

log = logging.getLogger(__name__)

ARCHITECTURES = frozenset({"llama", "qwen2", "qwen3"})

Arrays = dict[str, mx.array]
Carry = tuple[mx.array, mx.array, mx.array, mx.array]  # a layer's input and its q, k, v (RoPE applied)


@dataclass(frozen=True)
class Projection:
    """How to apply one nn.Linear / nn.QuantizedLinear (or a tied embedding read as one) to its arrays
    passed in as arguments; the same code as mlx.nn's, so the result is the same."""

    quantized: tuple[int, int, str] | None  # group_size, bits, mode
    bias: bool

    @staticmethod
    def of(module: nn.Module) -> Projection | None:
        if type(module) in (nn.Linear, nn.Embedding):
            return Projection(None, "bias" in module)
        if type(module) in (nn.QuantizedLinear, nn.QuantizedEmbedding):
            return Projection((module.group_size, module.bits, module.mode), "bias" in module)
        return None

    @staticmethod
    def arrays(module: nn.Module) -> Arrays:
        """The arrays the call takes. A dense weight goes in as its transpose (`weight.T` evaluated once
        shares the weight's memory), so no step builds a transpose per product."""
        found = {k: module[k] for k in ("weight", "scales", "biases", "bias") if module.get(k) is not None}
        if Projection.of(module) == Projection(None, "bias" in module):
            found["weight"] = found["weight"].T
        return found

    def __call__(self, x: mx.array, a: Arrays) -> mx.array:
        if self.quantized is None:
            if self.bias:
                return mx.addmm(a["bias"], x, a["weight"])
            return x @ a["weight"]
        group_size, bits, mode = self.quantized
        y = mx.quantized_matmul(
            x,
            a["weight"],
            scales=a["scales"],
            biases=a.get("biases"),
            transpose=True,
            group_size=group_size,
            bits=bits,
            mode=mode,
        )
        return y + a["bias"] if self.bias else y

    def add_to(self, c: mx.array, x: mx.array, a: Arrays) -> mx.array:
        """c + this projection of x: one matrix product with the sum (addmm) where the projection is
        a plain dense one, instead of a product and then an add kernel; on CUDA not for one row
        (`one_row_apart`)."""
        if self.quantized is None and not self.bias and not (x.size == x.shape[-1] and one_row_apart()):
            return mx.addmm(c, x, a["weight"])
        return c + self(x, a)


@cache
def one_row_apart() -> bool:
    """Whether a one-row residual product is written as a product, then an add: on CUDA. MLX's CUDA
    backend sends every AddMM to cuBLASLt (descriptors built and a stream captured per call: host
    time, 56 calls a qwen3-0.6b decode step) but a one-row Matmul against a transposed weight to its
    own GEMV kernel, a plain graph node (mlx/backend/cuda/matmul.cpp, `can_use_gemv`), and the add is
    another. Metal has a one-row AddMM kernel: kept there."""
    return on_cuda_gpu()


@dataclass(frozen=True)
class Group:
    """Projections of the same input: one fused product split into parts (fuse.py), or one each."""

    projection: Projection
    offsets: tuple[int, ...] | None  # fused: where the parts split; None: separate products

    @staticmethod
    def of(module: nn.Module, names: tuple[str, ...]) -> tuple[Group, list[Arrays]] | None:
        parts = [module.get(n) for n in names]
        if all(isinstance(p, FusedPart) for p in parts):
            shared = parts[0]._shared
            if any(p._shared is not shared for p in parts):
                return None
            projection = Projection.of(shared.linear)
            arrays = [Projection.arrays(shared.linear)]
            offsets: tuple[int, ...] | None = tuple(shared.offsets)
        else:
            kinds = {Projection.of(p) if isinstance(p, nn.Module) else None for p in parts}
            if len(kinds) != 1:
                return None
            projection = kinds.pop()
            arrays = [Projection.arrays(p) for p in parts]
            offsets = None
        return None if projection is None else (Group(projection, offsets), arrays)

    def __call__(self, x: mx.array, arrays: list[Arrays]) -> list[mx.array]:
        if self.offsets is None:
            return [self.projection(x, a) for a in arrays]
        return mx.split(self.projection(x, arrays[0]), list(self.offsets), axis=-1)


@dataclass(frozen=True)
class LayerPlan:
    """What every layer of the model shares (checked layer by layer), as the compiled code needs it."""

    heads: int
    kv_heads: int
    scale: float
    eps: float
    qk_norm: bool
    qkv: Group
    out: Projection
    gate_up: Group
    down: Projection
    head: Projection
    by_heads: bool  # q/k/v fused, all of one head size: one reshape of the product, split by heads

    @property
    def head_dim(self) -> int:
        assert self.qkv.offsets is not None
        return self.qkv.offsets[0] // self.heads


def _layer_arrays(layer: nn.Module, plan_qk_norm: bool) -> tuple[tuple, dict] | None:
    """(static description, arrays) of one decoder layer, or None where it is not the known pattern."""
    attn, mlp = layer.get("self_attn"), layer.get("mlp")
    if attn is None or mlp is None or getattr(layer, "use_sliding", False):
        return None
    norms = (layer.get("input_layernorm"), layer.get("post_attention_layernorm"))
    if any(type(n) is not nn.RMSNorm for n in norms):
        return None
    if type(mlp).__name__ != "MLP" or type(mlp).__module__ != type(layer).__module__:
        return None  # another feed-forward (MoE, other activation): not this pattern
    qkv = Group.of(attn, ("q_proj", "k_proj", "v_proj"))
    gate_up = Group.of(mlp, ("gate_proj", "up_proj"))
    out, down = Projection.of(attn.get("o_proj")), Projection.of(mlp.get("down_proj"))
    if qkv is None or gate_up is None or out is None or down is None:
        return None
    qk_norm = attn.get("q_norm") is not None
    if qk_norm != plan_qk_norm or (qk_norm and type(attn.get("k_norm")) is not nn.RMSNorm):
        return None
    eps = {norms[0].eps, norms[1].eps, *((attn.q_norm.eps, attn.k_norm.eps) if qk_norm else ())}
    if len(eps) != 1:
        return None
    by_heads = False
    if qkv[0].offsets is not None:
        size, (q_end, k_end) = attn.q_proj._shared.linear.weight.shape[0], qkv[0].offsets
        dim = q_end // attn.n_heads
        by_heads = q_end == attn.n_heads * dim and k_end - q_end == size - k_end == attn.n_kv_heads * dim
    static = (attn.n_heads, attn.n_kv_heads, attn.scale, eps.pop(), qkv[0], out, gate_up[0], down, by_heads)
    arrays = {
        "ln": norms[0].weight,
        "qkv": qkv[1],
        "o": Projection.arrays(attn.o_proj),
        "post": norms[1].weight,
        "gate_up": gate_up[1],
        "down": Projection.arrays(mlp.down_proj),
    }
    if qk_norm:
        arrays["qn"], arrays["kn"] = attn.q_norm.weight, attn.k_norm.weight
    return static, arrays


def same_rope(a: nn.Module, b: nn.Module) -> bool:
    if type(a) is not type(b):
        return False
    scalars = (int, float, bool, str, tuple, type(None))
    if {k: v for k, v in vars(a).items() if isinstance(v, scalars)} != {
        k: v for k, v in vars(b).items() if isinstance(v, scalars)
    }:
        return False
    if set(a) != set(b):
        return False
    return all(isinstance(a[k], mx.array) and mx.array_equal(a[k], b[k]).item() for k in a)


class CompiledDecoder:
    """The decode pass of a llama-style model as compiled functions around kinfer's paged attention.

    Build with `CompiledDecoder.wrap(model, model_type)` (None where the model is not of a known
    pattern); call with the decode inputs [B, 1] and one PagedKV view per layer, as the model."""

    def __init__(self, model: nn.Module, plan: LayerPlan, layers: list[dict], rope: nn.Module) -> None:
        backbone = model.model
        self._embed = backbone.embed_tokens
        self._layers = layers
        tied = model.args.tie_word_embeddings
        head = backbone.embed_tokens if tied else model.lm_head
        self._final = {"norm": backbone.norm.weight, "head": Projection.arrays(head)}
        self._head_eps = backbone.norm.eps
        self.plan = plan
        mx.eval(self._layers, self._final)  # the transposed weights: views of the same memory
        self.chunks = True  # one row's prompt chunks too, where shapes are bucketed (off: check.py)
        self._first = mx.compile(self._make_first(plan, rope))
        self._step = mx.compile(self._make_step(plan, rope))
        self._last = mx.compile(self._make_last(plan))

    @staticmethod
    def wrap(model: nn.Module, model_type: str) -> CompiledDecoder | None:
        """The compiled decoder of `model`, or None (logged) where its layers are not the known pattern."""
        reason = _unsupported(model, model_type)
        if reason is None:
            layers = list(model.layers)
            qk_norm = layers[0].self_attn.get("q_norm") is not None
            found = [_layer_arrays(layer, qk_norm) for layer in layers]
            if any(f is None for f in found):
                reason = "a layer differs from the llama pattern"
            elif len({f[0] for f in found}) != 1:  # type: ignore[index]
                reason = "layers differ in shape or projection kind"
            elif not all(same_rope(layers[0].self_attn.rope, lay.self_attn.rope) for lay in layers):
                reason = "layers differ in RoPE"
        if reason is not None:
            log.info("compiled decode step off for %s: %s", model_type, reason)
            return None
        backbone = model.model
        head = backbone.embed_tokens if model.args.tie_word_embeddings else model.get("lm_head")
        head_projection = Projection.of(head) if head is not None else None
        if head_projection is None or type(backbone.norm) is not nn.RMSNorm:
            log.info("compiled decode step off for %s: an unknown final norm or LM head", model_type)
            return None
        heads, kv_heads, scale, eps, qkv, out, gate_up, down, by_heads = found[0][0]  # type: ignore[index]
        plan = LayerPlan(
            heads, kv_heads, scale, eps, qk_norm, qkv, out, gate_up, down, head_projection, by_heads
        )
        return CompiledDecoder(model, plan, [f[1] for f in found], layers[0].self_attn.rope)  # type: ignore[index]

    def takes(self, inputs: mx.array) -> bool:
        """Whether this pass runs here: one position, or a chunk `shape_buckets.compiled_chunk` allows."""
        return inputs.shape[1] == 1 or (self.chunks and shape_buckets.compiled_chunk(len(inputs)))

    def __call__(self, inputs: mx.array, views: list) -> mx.array:
        logits = self.through(self.enter(inputs, views), views, range(len(views)))
        assert isinstance(logits, mx.array)
        return logits

    def enter(self, inputs: mx.array, views: list) -> Carry:
        """The pass up to its first layer's attention: the embedded inputs and layer 0's q, k, v."""
        x = self._embed(inputs)
        return (x, *self._first(x, views[0].layout.offsets, self._layers[0]))

    def through(self, carry: Carry, views: list, layers: range) -> Carry | mx.array:
        """The pass over `layers` (consecutive, starting where `carry` stands): the logits once they
        reach the last layer, else the carry into the next one (a prompt's chunk a few layers a step:
        prompt_passes.py)."""
        offsets = views[0].layout.offsets
        x, q, k, v = carry
        last = len(views) - 1
        for i in layers:
            view = views[i]
            view.update_and_fetch(k, v)
            attended = view.attend(q, k, v, scale=self.plan.scale)
            if i < last:
                x, q, k, v = self._step(x, attended, self._layers[i], self._layers[i + 1], offsets)
        if layers[-1] == last:
            return self._last(x, attended, self._layers[last], self._final)
        return x, q, k, v

    # ---- the compiled functions (static configuration closed over; arrays passed in) -----------

    @staticmethod
    def _make_first(plan: LayerPlan, rope: nn.Module) -> Callable:
        def first(x: mx.array, offsets: mx.array, w: dict) -> tuple[mx.array, mx.array, mx.array]:
            h = mx.fast.rms_norm(x, w["ln"], plan.eps)
            if plan.by_heads and x.shape[1] == 1:  # [B, 1, (H + 2 KV) * D] lies as [B, H + 2 KV, 1, D]
                qkv = plan.qkv.projection(h, w["qkv"][0]).reshape(x.shape[0], -1, 1, plan.head_dim)
                q, k, v = mx.split(qkv, [plan.heads, plan.heads + plan.kv_heads], axis=1)
            else:
                q, k, v = plan.qkv(h, w["qkv"])
                q, k, v = (_heads(t, n) for t, n in ((q, plan.heads), (k, plan.kv_heads), (v, plan.kv_heads)))
            if plan.qk_norm:  # over each head's last axis: the same values in either layout
                q = mx.fast.rms_norm(q, w["qn"], plan.eps)
                k = mx.fast.rms_norm(k, w["kn"], plan.eps)
            return rope(q, offset=offsets), rope(k, offset=offsets), v

        return first

    @staticmethod
    def _output_side(plan: LayerPlan, x: mx.array, attended: mx.array, w: dict) -> mx.array:
        from mlx_lm.models.activations import swiglu

        batch, length, _ = x.shape
        if length == 1:  # [B, H, 1, D] lies in memory as [B, 1, H * D]: no transpose
            attended = attended.reshape(batch, 1, -1)
        else:
            attended = attended.transpose(0, 2, 1, 3).reshape(batch, length, -1)
        h = plan.out.add_to(x, attended, w["o"])
        gate, up = plan.gate_up(mx.fast.rms_norm(h, w["post"], plan.eps), w["gate_up"])
        return plan.down.add_to(h, swiglu(gate, up), w["down"])

    @classmethod
    def _make_step(cls, plan: LayerPlan, rope: nn.Module) -> Callable:
        first = cls._make_first(plan, rope)

        def step(x: mx.array, attended: mx.array, w: dict, w_next: dict, offsets: mx.array) -> tuple:
            h = cls._output_side(plan, x, attended, w)
            return (h, *first(h, offsets, w_next))

        return step

    def _make_last(self, plan: LayerPlan) -> Callable:
        eps = self._head_eps

        def last(x: mx.array, attended: mx.array, w: dict, final: dict) -> mx.array:
            h = self._output_side(plan, x, attended, w)
            return plan.head(mx.fast.rms_norm(h, final["norm"], eps), final["head"])

        return last


def _heads(t: mx.array, heads: int) -> mx.array:
    """[B, L, heads * D] -> [B, heads, L, D]; for one position a reshape alone (the same memory)."""
    batch, length, _ = t.shape
    if length == 1:
        return t.reshape(batch, heads, 1, -1)
    return t.reshape(batch, length, heads, -1).transpose(0, 2, 1, 3)


def _unsupported(model: nn.Module, model_type: str) -> str | None:
    if model_type not in ARCHITECTURES:
        return "not a known architecture"
    backbone = model.get("model")
    if backbone is None or backbone.get("embed_tokens") is None or backbone.get("norm") is None:
        return "an unknown model layout"
    if type(backbone).__module__ != f"mlx_lm.models.{model_type}":
        return "an unknown model class"
    if getattr(backbone, "swa_idx", None) is not None:
        return "sliding-window layers"
    if getattr(backbone, "pipeline_size", 1) > 1:
        return "pipeline-parallel layers"
    return None
