"""Qwen3.5's pass a few layers at a time, through its own decoder layers: the layer split
(prompt_passes.py) for a hybrid model, whose GatedDeltaNet layers compiled_step.py does not take over.

Beside 16 decoding rows on the H200 a qwen3.5-0.8b prompt's 256-token chunk made a step of 20-22 ms
against 6 ms for a decode-only step, all host time (launch 14 ms): a 50,000-token prompt's chunks
stretched every streaming reply's gap 3.5x for the 200 steps it took, and its first chunk (a padded
pass, the recurrence's masked graph) 6x (docs/benchmarks.md, "H200, third session of 2026-12-05").
The same cut as a llama-style model's: a chunk's layers in consecutive ranges, one range a step, the
residual stream carried between them. Each layer runs as the model's own forward pass runs it (its
compiled functions where compiled_layers.py installed them, the masks the model would give it), so
a chunk in parts computes what it computes whole. The recurrent layers' state stays the chunk's own
between steps: its pass took the row's state when its views were made (state.StateLedger.begin), and
each layer writes its new state there as its range runs.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

Carry = tuple[mx.array]  # the residual stream into the next range's first layer

# model_type -> the backbone class (module, name) whose forward pass is embed, then each layer with
# its mask (`ssm_mask` for a linear layer, `fa_mask` for attention), then the final norm
BACKBONES = {"qwen3_5": ("mlx_lm.models.qwen3_5", "Qwen3_5TextModel")}


class HybridLayers:
    """A hybrid model's pass in ranges of layers (`enter`, then `through` each range), as the model's
    own `__call__` runs them. Build with `HybridLayers.wrap(model, model_type)`."""

    chunks = True  # a chunk's layers run their own code, compiled or not: the split never depends on it

    def __init__(self, backbone: nn.Module) -> None:
        self._backbone = backbone

    @staticmethod
    def wrap(model: nn.Module, model_type: str) -> HybridLayers | None:
        """The layered pass of `model`, or None where its backbone is not one this module knows."""
        known = BACKBONES.get(model_type)
        backbone = getattr(model, "model", None)
        if known is None or backbone is None:
            return None
        cls = type(backbone)
        if (cls.__module__, cls.__name__) != known or getattr(backbone, "pipeline_size", 1) > 1:
            return None
        return HybridLayers(backbone)

    def enter(self, inputs: mx.array, views: list) -> Carry:
        """The pass up to its first layer: the embedded inputs."""
        return (self._backbone.embed_tokens(inputs),)

    def through(self, carry: Carry, views: list, layers: range) -> Carry | mx.array:
        """The pass over `layers` (consecutive, starting where `carry` stands): the final norm's output
        once they reach the last layer (a prompt chunk's logits are never computed), else the carry."""
        from mlx_lm.models.base import create_attention_mask, create_ssm_mask

        backbone = self._backbone
        (h,) = carry
        # the model makes its masks from the views before any layer runs; they depend on the views
        # alone (kinfer's: the attention builds its own, a padded pass's recurrence its lengths')
        fa_mask = None if backbone.fa_idx is None else create_attention_mask(h, views[backbone.fa_idx])
        ssm_mask = None if backbone.ssm_idx is None else create_ssm_mask(h, views[backbone.ssm_idx])
        for i in layers:
            layer = backbone.layers[i]
            h = layer(h, mask=ssm_mask if layer.is_linear else fa_mask, cache=views[i])
        if layers[-1] == len(views) - 1:
            return backbone.norm(h)
        return (h,)
