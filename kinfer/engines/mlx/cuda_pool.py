"""Keep the GPU memory MLX hands back to CUDA's pool reserved, up to the memory budget.

MLX's CUDA allocator keeps freed buffers in its own cache up to `mx.set_cache_limit` (kinfer: 4 GiB,
sizing.py); past that it frees them with `cudaFreeAsync` into the device's default memory pool. That
pool's release threshold is 0 unless someone sets it, and CUDA then unmaps whatever the pool holds
unused at every synchronization: MLX synchronizes each time the host reads a step's tokens
(`cudaEventSynchronize`). The next `cudaMallocAsync` that the pool cannot serve maps physical memory
anew, milliseconds for a large buffer, inside the step's launch. A long prompt's chunks beside
streaming rows can churn hundreds of MB of scratch a step past that cache: the suspected cause of the
one-off 15-26 ms launches left in the H100's stall runs (docs/benchmarks.md, "H100, 2026-12-05"), not
yet measured against CUDA's default.

With the threshold at the memory budget the pool keeps what it was given up to the budget, the process
never holding more than it already reached (the budget bounds that too), and a buffer the pool holds
comes back at the cost of a sub-allocation. The driver API (libcuda) sets it for every device, so it
does not depend on which CUDA runtime MLX was built with. `KINFER_CUDA_POOL_KEEP=0` leaves CUDA's
default (release at every synchronization), to compare.

What the pool keeps is invisible to MLX's account and to the next model's sizing, which reads the
device's free memory: an engine that closes gives it back (`trim_pools`).
"""

from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger(__name__)

RELEASE_THRESHOLD = 4  # CU_MEMPOOL_ATTR_RELEASE_THRESHOLD (cuda.h), a cuuint64_t
ENV = "KINFER_CUDA_POOL_KEEP"


def _driver() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def _pools(driver: ctypes.CDLL | None) -> list[ctypes.c_void_p]:
    """Every device's default memory pool (none without a driver or a device)."""
    driver = driver if driver is not None else _driver()
    count = ctypes.c_int(0)
    if driver is None or driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return []
    pools = []
    for ordinal in range(count.value):
        device, pool = ctypes.c_int(0), ctypes.c_void_p(None)
        if (
            driver.cuDeviceGet(ctypes.byref(device), ordinal) == 0
            and driver.cuDeviceGetDefaultMemPool(ctypes.byref(pool), device) == 0
        ):
            pools.append(pool)
        else:
            log.warning("CUDA device %d: no default memory pool", ordinal)
    return pools


def keep_pool_reserved(threshold: int, driver: ctypes.CDLL | None = None, environ=os.environ) -> int:
    """Set every device's default pool to keep up to `threshold` bytes reserved at synchronizations.
    Returns the number of pools set (0: no driver, or turned off by the environment)."""
    if environ.get(ENV, "1") == "0":
        return 0
    driver = driver if driver is not None else _driver()
    value = ctypes.c_uint64(threshold)
    done = sum(
        driver.cuMemPoolSetAttribute(pool, RELEASE_THRESHOLD, ctypes.byref(value)) == 0
        for pool in _pools(driver)
    )
    if done:
        log.info("CUDA memory pools keep up to %.1f GiB reserved (%d devices)", threshold / (1 << 30), done)
    return done


def trim_pools(driver: ctypes.CDLL | None = None) -> int:
    """Give back to the device what every pool holds unused (after the engine's arrays are gone and
    the device has finished with them). Returns the number of pools trimmed."""
    driver = driver if driver is not None else _driver()
    return sum(driver.cuMemPoolTrimTo(pool, ctypes.c_size_t(0)) == 0 for pool in _pools(driver))
