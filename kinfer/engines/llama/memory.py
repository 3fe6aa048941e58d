"""What llama.cpp allocated, read from the lines it logs while it loads a model and builds a context,
and the llama.cpp engine's memory account (kinfer/engines/memory_account.py) made of them; the
engine's memory budget on its device.

llama.cpp's C API has no call that reports its buffers (`llama_get_memory_breakdown` is C++), but it
logs every one it allocates, e.g.:

    load_tensors:   CPU_Mapped model buffer size =    92.10 MiB
    llama_kv_cache:        CPU KV buffer size =    45.00 MiB
    llama_memory_recurrent:        CPU RS buffer size =     3.14 MiB
    llama_context:        CPU  output buffer size =     0.75 MiB
    sched_reserve:        CPU compute buffer size =    98.25 MiB

Buffers on several devices (a GPU and the host) are added up.
"""

from __future__ import annotations

import ctypes
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from kinfer.engines.budget import ram_total, resolve_budget
from kinfer.engines.memory_account import MemoryAccount
from kinfer.store.gguf_header import GGUFFormatError, read_gguf_header
from kinfer.store.model_shape import shape_from_gguf

_BUFFER = re.compile(r"\S+\s+(model|KV|RS|compute|output) buffer size\s*=\s*([\d.]+)\s*MiB")
_PART = {"model": "weights", "KV": "kv", "RS": "state", "compute": "scratch", "output": "scratch"}


@dataclass(frozen=True)
class BufferSizes:
    """Bytes llama.cpp reported, by account part (0 where it said nothing)."""

    weights: int = 0
    kv: int = 0
    state: int = 0
    scratch: int = 0

    def __add__(self, other: BufferSizes) -> BufferSizes:
        return BufferSizes(
            self.weights + other.weights,
            self.kv + other.kv,
            self.state + other.state,
            self.scratch + other.scratch,
        )


def parse_buffer_sizes(lines: list[str]) -> BufferSizes:
    sizes = {"weights": 0, "kv": 0, "state": 0, "scratch": 0}
    for line in lines:
        for kind, mib in _BUFFER.findall(line):
            sizes[_PART[kind]] += round(float(mib) * (1 << 20))
    return BufferSizes(**sizes)


def llama_account(
    buffers: BufferSizes, *, weights: int, kv: int, pool_slots: int, sequences: int, budget: int = 0
) -> MemoryAccount:
    """The engine's account. `weights` / `kv`: kinfer's own figures, used where the log said nothing.
    The recurrent state of the pool's sequence ids (the saved prompts' checkpoints) is the pool's part;
    their KV cells are counted in kv, like the MLX pool's blocks."""
    weights = buffers.weights or weights
    kv = buffers.kv or kv
    pool = buffers.state * pool_slots // sequences if sequences else 0
    state = buffers.state - pool
    total = weights + kv + buffers.state + buffers.scratch
    return MemoryAccount(weights, kv, state, pool, buffers.scratch, 0, total, budget)


def gguf_state_bytes(path: Path) -> int:
    """Recurrent state per sequence id, from the GGUF header (0 for attention-only models)."""
    try:
        shape = shape_from_gguf(read_gguf_header(path))
    except (GGUFFormatError, OSError):
        return 0
    return shape.state_bytes_per_row if shape else 0


def device_budget(setting_gb: float, gpu: bool) -> int:
    """The memory budget in bytes (kinfer/engines/budget.py): of the GPUs' memory when layers are
    offloaded (unified memory on a Mac), else of RAM."""
    total = _gpu_memory() if gpu else 0
    if not total:
        return resolve_budget(setting_gb, total=ram_total(), kind="ram")
    return resolve_budget(setting_gb, total=total, kind="unified" if sys.platform == "darwin" else "cuda")


_GPU_TYPES = (1, 2)  # ggml_backend_dev_type: GPU, IGPU


def _gpu_memory() -> int:
    """Total memory of ggml's GPU devices (what llama.cpp splits the layers over); 0 if unknown."""
    try:
        from kinfer.engines.llama import openmp  # noqa: F401  isort: skip  (before llama_cpp loads libgomp)
        import llama_cpp  # isort: skip

        lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / _GGML_LIB))
        lib.ggml_backend_dev_count.restype = ctypes.c_size_t
        lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
        lib.ggml_backend_dev_get.restype = ctypes.c_void_p
        lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
        lib.ggml_backend_dev_type.restype = ctypes.c_int
        size_p = ctypes.POINTER(ctypes.c_size_t)
        lib.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, size_p, size_p]
        total = 0
        for i in range(lib.ggml_backend_dev_count()):
            device = lib.ggml_backend_dev_get(i)
            if lib.ggml_backend_dev_type(device) in _GPU_TYPES:
                free, size = ctypes.c_size_t(0), ctypes.c_size_t(0)
                lib.ggml_backend_dev_memory(device, ctypes.byref(free), ctypes.byref(size))
                total += size.value
        return total
    except (OSError, AttributeError):
        return 0


_GGML_LIB = {"darwin": "libggml.dylib", "win32": "ggml.dll"}.get(sys.platform, "libggml.so")
