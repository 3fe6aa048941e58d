"""libllama is loaded before numpy and llguidance, whatever a process imports from kinfer first.

On the H200 (CUDA llama.cpp), loading numpy's or llguidance's library first made every later GGUF
model load segfault: the server imports numpy and the constraint code at start and loads llama.cpp
models on demand, so it crashed on its first request (kinfer/libllama_first.py says how it was
bisected). `kinfer/__init__.py` loads libllama first; `kinfer.constrain.library`, the one module
importing llguidance, loads llama_cpp before it too. This pins both.
"""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "first_import",
    [
        "kinfer.cli",
        "kinfer.server.app",
        "kinfer.engines.llama.engine",
        "kinfer.constrain.runtime",
        "kinfer.constrain.grammars",
        "kinfer.engines.mlx.grammar",
        "kinfer.store.models",
    ],
)
def test_libllama_is_loaded_before_numpy_and_llguidance(first_import):
    probe = (
        f"import {first_import}, sys; names = list(sys.modules); first = names.index('llama_cpp.llama_cpp'); "
        "print(all(first < names.index(m) for m in ('numpy', 'llguidance') if m in names))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "True"
