"""libllama is loaded before numpy and llguidance in a serving process.

On the H200 (CUDA llama.cpp), loading numpy's or llguidance's library first made every later GGUF
model load segfault: the server crashed on its first GGUF request (kinfer/libllama_first.py says
how it was bisected). `serve()` loads libllama before it imports anything, and the command line
loads no numpy before that; `kinfer.constrain.library`, the one module importing llguidance, loads
llama_cpp before it too (for processes that do not go through `serve()`, such as the benchmarks).
"""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

from kinfer.commands.serve import serve


def run_probe(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip()


def test_the_command_line_loads_no_numpy_before_serve_loads_libllama():
    probe = (
        "import sys, kinfer.cli; kinfer.cli.build_parser(); print('numpy' in sys.modules)\n"
        "from kinfer.libllama_first import load_libllama_first; print(load_libllama_first())\n"
        "import kinfer.runtime, kinfer.server.app, kinfer.engines.llama.engine\n"
        "names = list(sys.modules); first = names.index('llama_cpp.llama_cpp')\n"
        "print(all(first < names.index(m) for m in ('numpy', 'llguidance')))"
    )
    assert run_probe(probe).split() == ["False", "True", "True"]


def test_serve_loads_libllama_before_it_imports_anything():
    lines = inspect.getsource(serve).splitlines()[1:]  # after the signature
    first_call = next(line.strip() for line in lines if line.strip() and "import" not in line)
    assert first_call.startswith("load_libllama_first()")


@pytest.mark.parametrize(
    "first_import", ["kinfer.constrain.runtime", "kinfer.constrain.grammars", "kinfer.engines.mlx.grammar"]
)
def test_llguidance_comes_after_libllama_whoever_imports_it(first_import):
    probe = (
        f"import {first_import}, sys; names = list(sys.modules); "
        "print(names.index('llama_cpp') < names.index('llguidance'))"
    )
    assert run_probe(probe) == "True"


def test_a_broken_llama_cpp_costs_the_gguf_models_only(monkeypatch, caplog):
    from kinfer.libllama_first import load_libllama_first

    monkeypatch.setitem(sys.modules, "llama_cpp.llama_cpp", None)  # its import now fails
    assert load_libllama_first() is False
    assert "GGUF models cannot be served" in caplog.text
