"""The engine memory budget: how many bytes one loaded model may hold (weights, KV, state, pool,
scratch and MLX's cache together), and its default.

Default (`--memory-budget 0`): a share of the memory the engine allocates from:
- RAM (llama.cpp or MLX on a CPU): 75 %, leaving the rest to the OS, the server's Python side and the
  other programs a laptop runs (a browser and an IDE are the normal case);
- Apple silicon's unified memory: 75 %, about what Metal's recommended working set allows a GPU
  process on most Macs (macOS keeps the rest for itself);
- a CUDA GPU's memory: 90 %, vLLM's default `gpu_memory_utilization`; the driver, the CUDA context and
  the libraries' workspaces take the rest.
Engine sizing fits rows, KV, the pool's state cap and MLX's cache limit in it (engines/*/sizing.py).
"""

from __future__ import annotations

import psutil

GIB = 1 << 30
RAM_SHARE = 0.75
UNIFIED_SHARE = 0.75
CUDA_SHARE = 0.9


def default_budget(total: int, *, kind: str) -> int:
    """The budget on a device of `total` bytes; kind: "ram", "unified" or "cuda"."""
    share = {"ram": RAM_SHARE, "unified": UNIFIED_SHARE, "cuda": CUDA_SHARE}[kind]
    return int(total * share)


def resolve_budget(setting_gb: float, *, total: int, kind: str) -> int:
    """Bytes from the setting: > 0 is GiB as given, 0 the default share, < 0 no budget (0 bytes)."""
    if setting_gb > 0:
        return int(setting_gb * GIB)
    if setting_gb < 0:
        return 0
    return default_budget(total, kind=kind)


def ram_total() -> int:
    return int(psutil.virtual_memory().total)
