"""The memory budget's default and its setting: a share of the memory the engine allocates from."""

from __future__ import annotations

import psutil
import pytest

from kinfer.engines.budget import GIB, default_budget, resolve_budget
from kinfer.engines.llama.memory import device_budget as llama_budget
from kinfer.engines.mlx.memory import device_budget as mlx_budget


def test_the_default_is_three_quarters_of_ram_or_unified_memory_and_nine_tenths_of_a_gpus():
    assert default_budget(32 * GIB, kind="ram") == 24 * GIB
    assert default_budget(32 * GIB, kind="unified") == 24 * GIB
    assert default_budget(140 * GIB, kind="cuda") == 126 * GIB


def test_a_setting_in_gib_wins_and_a_negative_one_means_no_budget():
    assert resolve_budget(2.5, total=64 * GIB, kind="ram") == int(2.5 * GIB)
    assert resolve_budget(-1, total=64 * GIB, kind="ram") == 0
    assert resolve_budget(0, total=64 * GIB, kind="ram") == 48 * GIB


def test_on_this_cpu_both_engines_take_their_share_of_ram():
    ram = psutil.virtual_memory().total
    assert llama_budget(0, gpu=False) == mlx_budget(0, gpu=False) == int(ram * 0.75)
    assert llama_budget(1.0, gpu=False) == mlx_budget(1.0, gpu=False) == GIB


def test_without_a_gpu_device_ggml_reports_none_and_ram_is_used():
    from kinfer.engines.llama import native

    native.init_backend()
    if native.supports_gpu_offload():
        pytest.skip("a GPU build: its devices' memory is used instead")
    assert llama_budget(0, gpu=True) == int(psutil.virtual_memory().total * 0.75)


# what mx.device_info() holds on each backend (MLX 0.32: mlx/backend/{cuda,metal}/device_info.cpp)
CUDA_INFO = {"device_name": "NVIDIA H200", "total_memory": 140 * GIB, "free_memory": 100 * GIB}
METAL_INFO = {"device_name": "Apple M3 Max", "memory_size": 64 * GIB}


def test_on_cuda_the_mlx_budget_and_sizing_read_the_gpus_memory_not_the_hosts(monkeypatch):
    import mlx.core as mx

    from kinfer.engines.mlx import sizing

    monkeypatch.setattr(mx, "device_info", lambda *a: CUDA_INFO)
    monkeypatch.setattr(mx.metal, "is_available", lambda: False)
    assert mlx_budget(0, gpu=True) == 126 * GIB  # 90 % of the GPU's 140 GiB, whatever the host's RAM
    assert sizing._available_memory(gpu=True) == 100 * GIB  # what the device has left (NVML)


def test_on_apple_silicon_the_mlx_budget_reads_unified_memory(monkeypatch):
    import mlx.core as mx

    from kinfer.engines.mlx import sizing

    monkeypatch.setattr(mx, "device_info", lambda *a: METAL_INFO)
    monkeypatch.setattr(mx.metal, "is_available", lambda: True)
    assert mlx_budget(0, gpu=True) == 48 * GIB
    assert sizing._available_memory(gpu=True) == 64 * GIB - mx.get_active_memory()
