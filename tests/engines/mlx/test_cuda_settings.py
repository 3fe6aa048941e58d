"""MLX's CUDA settings kinfer picks for serving: set on a CUDA GPU only, and never over the user's own."""

from __future__ import annotations

import os

import pytest

from kinfer.engines.mlx import cuda_settings


@pytest.fixture
def clean_env(monkeypatch):
    for name in cuda_settings.SERVING_DEFAULTS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_on_a_cuda_gpu_cudnn_attention_is_turned_off(clean_env):
    clean_env.setattr(cuda_settings, "on_cuda_gpu", lambda: True)
    assert cuda_settings.apply_serving_defaults() == {"MLX_CUDA_USE_CUDNN_SDPA": "0"}
    assert os.environ["MLX_CUDA_USE_CUDNN_SDPA"] == "0"


def test_the_users_own_setting_wins(clean_env):
    clean_env.setattr(cuda_settings, "on_cuda_gpu", lambda: True)
    clean_env.setenv("MLX_CUDA_USE_CUDNN_SDPA", "1")
    assert cuda_settings.apply_serving_defaults() == {}
    assert os.environ["MLX_CUDA_USE_CUDNN_SDPA"] == "1"


def test_elsewhere_nothing_is_set(clean_env):
    clean_env.setattr(cuda_settings, "on_cuda_gpu", lambda: False)
    assert cuda_settings.apply_serving_defaults() == {}
    assert "MLX_CUDA_USE_CUDNN_SDPA" not in os.environ
