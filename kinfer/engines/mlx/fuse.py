"""One matrix product where a layer makes several from the same input (q/k/v, gate/up, ...).

On MLX's CUDA backend every matrix product with more than one row sets up its own cuBLASLt descriptors,
algorithm heuristic and stream capture on the host, so at a few dozen rows per step the host spends more
time preparing products than the GPU spends computing them. Fusing the projections that read the same
input (their weights concatenated) cuts the products per layer from seven to four; each part still
returns exactly its own slice, so mlx-lm's model code runs unchanged.

A part recomputes the fused product whenever it sees a different input than the previous call, so a
model that happened to call the parts on different inputs would stay correct (only slower). Once every
part has taken its slice the shared outputs are let go: held until the layer's next call, they kept
the last prefill pass's projections of every layer alive wherever the decode pass does not go through
the modules (the compiled step): 1,388 MB of MLX memory no part of the account named, for as long as
the model stayed loaded (H200, qwen3-0.6b shape, a 2,048-token pass).
"""

from __future__ import annotations

import logging

import mlx.core as mx
import mlx.nn as nn

log = logging.getLogger(__name__)

GROUPS = (
    ("q_proj", "k_proj", "v_proj"),
    ("gate_proj", "up_proj"),
    ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"),  # qwen3_5 / qwen3_next GatedDeltaNet
)


class _Shared:
    """The fused projection and its last input / outputs (a plain object: not part of the module tree)."""

    def __init__(self, linear: nn.Module, sizes: list[int]) -> None:
        self.linear = linear
        self.offsets = [sum(sizes[: i + 1]) for i in range(len(sizes) - 1)]
        self.last: mx.array | None = None
        self.outputs: list[mx.array] = []
        self.left = 0  # slices of `outputs` not taken yet


class FusedPart(nn.Module):
    """Stands in for one of the fused projections."""

    def __init__(self, shared: _Shared, index: int) -> None:
        super().__init__()
        object.__setattr__(self, "_shared", shared)
        object.__setattr__(self, "_index", index)

    def __call__(self, x: mx.array) -> mx.array:
        shared = self._shared
        if shared.last is not x:
            shared.outputs = mx.split(shared.linear(x), shared.offsets, axis=-1)
            shared.last, shared.left = x, len(shared.outputs)
        out = shared.outputs[self._index]
        shared.left -= 1
        if shared.left == 0:  # as many slices taken as there are parts: hold none of them
            shared.last, shared.outputs = None, []
        return out


def _fusable(parts: list[nn.Module]) -> bool:
    first = parts[0]
    kind = type(first)
    if kind not in (nn.Linear, nn.QuantizedLinear) or any(type(p) is not kind for p in parts):
        return False
    if len({("bias" in p) for p in parts}) != 1 or len({p.weight.shape[1] for p in parts}) != 1:
        return False
    if kind is nn.QuantizedLinear:
        same = {(p.group_size, p.bits, p.mode, p.get("biases") is not None) for p in parts}
        return len(same) == 1
    return len({p.weight.dtype for p in parts}) == 1


def _concat(parts: list[nn.Module]) -> nn.Module:
    first = parts[0]
    fused = nn.Linear.__new__(type(first))
    nn.Module.__init__(fused)
    for key in ("group_size", "bits", "mode"):
        if hasattr(first, key):
            setattr(fused, key, getattr(first, key))
    for key in ("weight", "scales", "biases", "bias"):
        if first.get(key) is not None:
            fused[key] = mx.concatenate([p[key] for p in parts], axis=0)
    if isinstance(fused, nn.QuantizedLinear):
        fused.freeze()
    return fused


def fuse_projections(model: nn.Module) -> int:
    """Fuse every projection group found in `model` in place; returns how many groups were fused."""
    fused_groups = 0
    for _, module in model.named_modules():
        for names in GROUPS:
            parts = [module.get(n) if isinstance(module, dict) else None for n in names]
            if any(p is None for p in parts) or not _fusable(parts):
                continue
            shared = _Shared(_concat(parts), [p.weight.shape[0] for p in parts])
            module["_".join(names) + "_fused"] = shared.linear
            for i, name in enumerate(names):
                setattr(module, name, FusedPart(shared, i))
            fused_groups += 1
    if fused_groups:
        mx.eval(model.parameters())
    return fused_groups
