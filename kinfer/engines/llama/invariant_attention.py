"""Whether the loaded llama.cpp runs flash attention on the CPU with one arithmetic for every pass.

Upstream ggml's CPU flash attention picks a kernel by a pass's shape (a row decoding alone over 512
cells or more is split across the threads, 64 queries of a row or more are tiled, anything else goes
query by query), each rounding differently, so a reply batched beside others, a prompt cut at other
places, or a pooled prefix holding decoded tokens would part from its solo cold run. kinfer's setup
(scripts/setup.sh) builds llama-cpp-python with
`patches/llama-cpp-python-0.3.36/cpu-flash-attention-batch-invariant.patch`: every query's scores
are one dot per cell with a fixed order of sums, and its cells go in 256-cell chunks whose softmax
sums are merged in order, in prompt tiles and decoding rows alike, so a lone long row's chunks can be
split across the threads without changing a bit. A token's numbers then depend on
its own sequence only, even between decoding it and reading it back as prompt. The patched library
exports `ggml_cpu_flash_attn_batch_invariant` (1, or 0 under `GGML_CPU_FA_BATCH_INVARIANT=0`), which
is what this module asks; a stock llama-cpp-python has no such symbol, and its CPU contexts keep
flash attention off (native.create_context).
"""

from __future__ import annotations

import ctypes
import functools
import os

from kinfer.engines.llama import openmp  # noqa: F401  isort: skip  (before llama_cpp loads libgomp)
import llama_cpp  # noqa: F401  isort: skip  (loads the ggml library looked up below)

SYMBOL = "ggml_cpu_flash_attn_batch_invariant"
# the copy libllama loaded, by its soname (the wheel also ships same-named files without the version
# suffix: loading one of those would make a second ggml); macOS names it by its install name
_CPU_LIBRARY_NAMES = ("libggml-cpu.so.0", "libggml-cpu.so", "libggml-cpu.dylib")


@functools.cache
def batch_invariant_cpu_flash_attention() -> bool:
    """True if the loaded ggml CPU backend has kinfer's batch-invariant flash attention, switched on."""
    for name in _CPU_LIBRARY_NAMES:
        try:
            library = ctypes.CDLL(name, mode=getattr(os, "RTLD_NOLOAD", 0) | os.RTLD_LOCAL)
        except OSError:
            continue
        probe = getattr(library, SYMBOL, None)
        if probe is None:
            return False
        probe.restype = ctypes.c_int
        probe.argtypes = []
        return bool(probe())
    return False
