"""CUDA's memory pools keep what MLX frees into them, up to the budget (kinfer/engines/mlx/cuda_pool.py).
The driver here is a stand-in that records the calls (CI has no GPU)."""

from __future__ import annotations

import ctypes

from kinfer.engines.mlx import cuda_pool
from kinfer.engines.mlx.cuda_pool import ENV, RELEASE_THRESHOLD, keep_pool_reserved, trim_pools


class RecordingDriver:
    """libcuda's calls the module makes, on `devices` devices, each pool a distinct handle."""

    def __init__(self, devices: int, failing_pool: int | None = None) -> None:
        self.devices = devices
        self.failing_pool = failing_pool
        self.thresholds: dict[int, int] = {}
        self.trimmed: dict[int, int] = {}

    def cuInit(self, flags: int) -> int:
        return 0

    def cuDeviceGetCount(self, count) -> int:
        count._obj.value = self.devices
        return 0

    def cuDeviceGet(self, device, ordinal: int) -> int:
        device._obj.value = ordinal
        return 0

    def cuDeviceGetDefaultMemPool(self, pool, device: ctypes.c_int) -> int:
        pool._obj.value = 0x1000 + device.value
        return 0

    def cuMemPoolSetAttribute(self, pool: ctypes.c_void_p, attribute: int, value) -> int:
        assert attribute == RELEASE_THRESHOLD
        ordinal = pool.value - 0x1000
        if ordinal == self.failing_pool:
            return 1  # CUDA_ERROR_INVALID_VALUE
        self.thresholds[ordinal] = value._obj.value
        return 0

    def cuMemPoolTrimTo(self, pool: ctypes.c_void_p, keep: ctypes.c_size_t) -> int:
        self.trimmed[pool.value - 0x1000] = keep.value
        return 0


def test_every_devices_pool_keeps_up_to_the_budget():
    driver = RecordingDriver(devices=2)
    assert keep_pool_reserved(70 << 30, driver, environ={}) == 2
    assert driver.thresholds == {0: 70 << 30, 1: 70 << 30}


def test_a_device_that_refuses_is_skipped_and_the_rest_are_set():
    driver = RecordingDriver(devices=3, failing_pool=1)
    assert keep_pool_reserved(1 << 30, driver, environ={}) == 2
    assert driver.thresholds == {0: 1 << 30, 2: 1 << 30}


def test_the_environment_can_leave_cudas_default():
    driver = RecordingDriver(devices=1)
    assert keep_pool_reserved(1 << 30, driver, environ={ENV: "0"}) == 0
    assert driver.thresholds == {}


def test_without_a_cuda_driver_nothing_is_set(monkeypatch):
    monkeypatch.setattr(cuda_pool, "_driver", lambda: None)  # libcuda.so.1 not found (a CPU, a Mac)
    assert keep_pool_reserved(1 << 30, environ={}) == 0
    assert trim_pools() == 0


def test_a_closing_engine_gives_every_pools_unused_memory_back():
    driver = RecordingDriver(devices=2)
    assert trim_pools(driver) == 2
    assert driver.trimmed == {0: 0, 1: 0}
