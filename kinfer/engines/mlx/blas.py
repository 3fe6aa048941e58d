"""Preload a fast BLAS for MLX on Linux CPUs, before `mlx.core` is first imported.

The `mlx-cpu` wheel bundles netlib's reference BLAS, about ten times slower than OpenBLAS for the
matrix products a model runs. Loading Debian's OpenBLAS with RTLD_GLOBAL first makes the dynamic
linker resolve MLX's `cblas_*` / `sgemm_` symbols to it. Import this module before anything that
imports `mlx`; it does nothing on other systems or when OpenBLAS is not installed.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys

log = logging.getLogger(__name__)

OPENBLAS_PATHS = (
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
)

preloaded: str | None = None


def _preload() -> str | None:
    if not sys.platform.startswith("linux"):
        return None
    if "mlx.core" in sys.modules:
        # too late: MLX already bound its BLAS symbols
        log.debug("mlx.core was imported before kinfer.engines.mlx.blas; BLAS left as is")
        return None
    for path in OPENBLAS_PATHS:
        if os.path.exists(path):
            try:
                ctypes.CDLL(path, mode=os.RTLD_GLOBAL)
            except OSError as exc:  # a broken install must not stop the server
                log.warning("could not preload %s: %s", path, exc)
                continue
            return path
    return None


preloaded = _preload()
