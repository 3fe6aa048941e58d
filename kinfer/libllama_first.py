"""libllama is the first native library a kinfer process loads, before numpy's.

On the H200 (llama-cpp-python 0.3.36 built for CUDA, numpy 2.x), loading any GGUF model segfaulted
in `llama_model_load_from_file` whenever numpy (and its bundled OpenBLAS) or llguidance had been
loaded before libllama, and never when libllama came first: kinfer's server died on its first GGUF
request (bisected there, one process per case: a plain `llama_cpp` load, kinfer's engine on the main
thread or a worker thread, with and without the server's imports and larger thread stacks; only the
order mattered). `kinfer/__init__.py` imports this module, so whatever a process imports from kinfer
first, libllama is in before numpy. Without llama-cpp-python (an MLX-only install) it does nothing.
tests/test_library_order.py pins the order.
"""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("llama_cpp") is not None:
    from kinfer.engines.llama import openmp  # noqa: F401  isort: skip  (before libgomp loads)
    import llama_cpp.llama_cpp  # noqa: F401  isort: skip  (the ctypes binding: libllama, no numpy yet)
