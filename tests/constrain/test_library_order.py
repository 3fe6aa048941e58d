"""libllama is loaded before llguidance, whatever a process imports first.

On the H200 (CUDA llama.cpp), loading llguidance's library first made every later GGUF model load
segfault: the server imports the constraint code at start and loads llama.cpp models on demand, so
it crashed on its first request. The constraint package loads llama_cpp first; this pins it.
"""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "first_import",
    [
        "kinfer.constrain.runtime",
        "kinfer.constrain.grammars",
        "kinfer.server.app",
        "kinfer.engines.mlx.grammar",
    ],
)
def test_llama_cpp_is_loaded_before_llguidance(first_import):
    probe = (
        f"import {first_import}, sys; names = list(sys.modules); "
        "print(names.index('llama_cpp') < names.index('llguidance'))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "True"
