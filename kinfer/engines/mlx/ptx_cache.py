"""Where MLX's CUDA backend keeps the kernels it compiles: under kinfer's home, not the temp folder.

MLX on CUDA compiles many kernels at first use (its JIT: gathers and scatters per dtype, fused
elementwise chains, kinfer's own custom kernels) with NVRTC, 1-4 s each on the H200, and keeps the
result on disk, by default in `<temp>/mlx/<version>/ptx`. A model's first load on an empty cache took
84-87 s there against 15-20 s once cached (docs/benchmarks.md, seventh H200 session of 2026-12-02).
Many Linux systems empty /tmp at every boot (Ubuntu does), so each reboot paid that again on the
next load. kinfer points MLX at `KINFER_HOME/cache/mlx-ptx/<mlx version>` instead (the version keeps an
MLX upgrade from loading kernels its predecessor compiled, as MLX's own default does). A user's own
`MLX_PTX_CACHE_DIR` wins. MLX reads the variable when it compiles its first kernel, so this runs
before the first MLX model loads.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

VARIABLE = "MLX_PTX_CACHE_DIR"


def keep_compiled_kernels(
    home: Path, mlx_version: str, environ: dict[str, str] | os._Environ = os.environ
) -> str:
    """Point MLX's kernel cache under `home` unless the user chose one; returns the folder in force
    ("" where none could be made: MLX then keeps its default)."""
    if environ.get(VARIABLE):
        return environ[VARIABLE]
    folder = Path(home).expanduser() / "cache" / "mlx-ptx" / mlx_version
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # a read-only home: MLX's own default still works
        log.warning("MLX kernel cache stays in the temp folder (%s: %s)", folder, error)
        return ""
    environ[VARIABLE] = str(folder)
    return str(folder)


def keep_kernels_on_cuda(home: Path) -> str:
    """`keep_compiled_kernels` where this process's MLX computes on a CUDA GPU (elsewhere MLX compiles
    no PTX); returns the folder in force, "" for none."""
    import mlx.core as mx

    from kinfer.engines.mlx.kernels import on_cuda_gpu

    return keep_compiled_kernels(home, mx.__version__) if on_cuda_gpu() else ""
