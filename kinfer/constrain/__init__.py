"""Constrained decoding: structured output and forced tool calls as grammars (llguidance).

spec.py: the `Constraint` a job carries; grammars.py: JSON Schema and tool-call formats as Lark text;
build.py: which constraint a request gets; runtime.py: per-row grammar state and token masks, shared
by both engines.
"""

# libllama must be loaded before llguidance's library: the other way round, llama.cpp's CUDA build
# segfaults loading any model (seen on the H200, mlx 0.32.4 / llama-cpp-python 0.3.36 / llguidance 1.9.1).
# Modules of this package import llguidance after this has run; modules elsewhere take llguidance's
# names from `kinfer.constrain.library`, never from llguidance directly (tests/constrain pins it).
import llama_cpp  # noqa: F401  isort: skip
