"""Load libllama before numpy in a process that will serve models.

On the H200 (llama-cpp-python 0.3.36 built for CUDA, numpy 2.x), loading any GGUF model segfaulted
in `llama_model_load_from_file` whenever numpy (and its bundled OpenBLAS) or llguidance had been
loaded before libllama, and never when libllama came first: kinfer's server died on its first GGUF
request. Bisected there, one process per case: a plain `llama_cpp` load, kinfer's engine on the main
thread or a worker thread, with and without the server's imports, with 256 MiB thread stacks; only
the order mattered. `serve()` calls `load_libllama_first()` before it imports anything else (the CLI
itself loads no numpy), so the server, the dashboard and every rank of a distributed model get the
safe order, while `kinfer list` / `pull` / `can-run` still load no engine. Without llama-cpp-python
(an MLX-only install) it does nothing; a llama-cpp-python whose library does not load (a broken
build) costs the GGUF models only, with a warning, not the MLX ones. tests/test_library_order.py pins
the order.
"""

from __future__ import annotations

import importlib.util
import logging

log = logging.getLogger(__name__)


def load_libllama_first() -> bool:
    """Load llama.cpp's library now (its ctypes binding: no numpy yet), if llama-cpp-python is
    installed; True if it is loaded."""
    if importlib.util.find_spec("llama_cpp") is None:
        return False
    from kinfer.engines.llama import openmp  # noqa: F401  isort: skip  (before libgomp loads)

    try:
        import llama_cpp.llama_cpp  # noqa: F401  isort: skip
    except (ImportError, OSError) as exc:  # the engine says so again when a GGUF is asked for
        log.warning("llama.cpp's library did not load (%s): GGUF models cannot be served", exc)
        return False
    return True
