"""Settings of MLX's CUDA backend that kinfer chooses for serving, each left to the user's environment
when it already names it.

MLX reads these once per process, at first use, so they are set before an engine runs its first pass.

- `MLX_CUDA_USE_CUDNN_SDPA=0`: prefill attention through MLX's own kernels, not cuDNN. cuDNN builds
  and plans a graph for every exact shape *and stride* of q, k and v (~66 ms of host time each on the
  H200, `scripts/probe_mlx_graphs.py`), and a server's prefill passes change shape step after step
  (rows joining, chunks, prefixes): at 64 streams of 128-token prompts the first tokens came after
  2.73 s (p50) with cuDNN and 0.85 s without (docs/benchmarks.md, "H200, 2026-12-02, fourth session").
  Decode attention never used it (kinfer's paged kernel, `kernels.py`).
"""

from __future__ import annotations

import logging
import os

from kinfer.engines.mlx.kernels import on_cuda_gpu

log = logging.getLogger(__name__)

SERVING_DEFAULTS = {"MLX_CUDA_USE_CUDNN_SDPA": "0"}


def apply_serving_defaults() -> dict[str, str]:
    """On a CUDA GPU, set each of SERVING_DEFAULTS the environment does not already set; returns what
    was set (nothing elsewhere)."""
    if not on_cuda_gpu():
        return {}
    chosen = {name: value for name, value in SERVING_DEFAULTS.items() if name not in os.environ}
    os.environ.update(chosen)
    if chosen:
        log.debug("MLX CUDA settings: %s", chosen)
    return chosen
