"""Projection fusion, the rewrite the MLX engine applies to a loaded model on a GPU: q/k/v, gate/up and
the GatedDeltaNet input projections become one matrix product each (MLX's CUDA backend pays a host-side
setup per product), and every part still returns exactly its own slice, so the model's output is the
same as before.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from kinfer.engines.mlx import blas  # noqa: F401
from kinfer.engines.mlx.fuse import FusedPart, fuse_projections
from tests.fixtures.tiny_mlx import _config


def _model(arch: str):
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(_config(arch, vocab=96, eos_id=1))
    mx.random.seed(3)
    model = model_class(args_class.from_dict(_config(arch, vocab=96, eos_id=1)))
    mx.eval(model.parameters())
    return model


def _logits(model) -> np.ndarray:
    tokens = mx.array([[5, 17, 42, 9, 3, 77], [1, 2, 3, 4, 5, 6]])
    return np.array(model(tokens).astype(mx.float32))


@pytest.mark.parametrize(("arch", "groups"), [("llama", 2 * 2), ("qwen3", 2 * 2), ("qwen3_5", 4 + 2 + 2)])
def test_fused_projections_give_the_same_logits(arch, groups):
    model = _model(arch)
    before = _logits(model)
    linears = sum(type(m) is nn.Linear for _, m in model.named_modules())
    assert fuse_projections(model) == groups
    parts = [m for _, m in model.named_modules() if isinstance(m, FusedPart)]
    # each fused group leaves one product where there were several
    assert sum(type(m) is nn.Linear for _, m in model.named_modules()) == linears - len(parts) + groups
    np.testing.assert_allclose(_logits(model), before, rtol=1e-5, atol=1e-5)


def test_a_part_called_on_a_different_input_recomputes():
    model = _model("qwen3")
    fuse_projections(model)
    attn = model.model.layers[0].self_attn
    x, y = mx.random.normal((1, 2, 64)), mx.random.normal((1, 2, 64))
    q_x = attn.q_proj(x)
    k_y = attn.k_proj(y)  # a different input: the fused product runs again
    fused = attn["q_proj_k_proj_v_proj_fused"]
    np.testing.assert_allclose(np.array(q_x), np.array((x @ fused.weight.T)[..., : q_x.shape[-1]]), atol=1e-5)
    np.testing.assert_allclose(
        np.array(k_y),
        np.array((y @ fused.weight.T)[..., q_x.shape[-1] : q_x.shape[-1] + k_y.shape[-1]]),
        atol=1e-5,
    )


def test_once_every_part_took_its_slice_nothing_of_the_product_is_held():
    # held until the layer's next call, the outputs of the last prefill pass stayed alive wherever the
    # decode pass skips the modules (the compiled step): 1,388 MB on the H200 for a qwen3-0.6b shape
    model = _model("qwen3")
    fuse_projections(model)
    attn = model.model.layers[0].self_attn
    x = mx.random.normal((1, 2, 64))
    shared = attn.q_proj._shared
    q, k = attn.q_proj(x), attn.k_proj(x)
    assert shared.outputs and shared.last is x  # v has not taken its slice yet
    v = attn.v_proj(x)
    assert shared.outputs == [] and shared.last is None
    fused = attn["q_proj_k_proj_v_proj_fused"]
    np.testing.assert_allclose(
        np.array(mx.concatenate([q, k, v], axis=-1)), np.array(x @ fused.weight.T), atol=1e-5
    )


def test_a_part_called_twice_on_one_input_gets_its_slice_again():
    model = _model("qwen3")
    fuse_projections(model)
    attn = model.model.layers[0].self_attn
    x = mx.random.normal((1, 2, 64))
    first = attn.q_proj(x)
    again = attn.q_proj(x)
    np.testing.assert_allclose(np.array(again), np.array(first), atol=1e-6)
