"""llguidance, loaded after libllama: the one module that imports it (every other takes its names here).

The other way round, llama.cpp's CUDA build segfaults loading any model once llguidance's library is in
the process (seen on the H200: mlx 0.32.4, llama-cpp-python 0.3.36, llguidance 1.9.1), and the server
loads its constraint code at start but its models on demand. tests/constrain/test_library_order.py
pins it. Importing this module therefore loads libllama: the store and `can-run` must not need it.
"""

from __future__ import annotations

from kinfer.engines.llama import openmp  # noqa: F401  isort: skip  (before llama_cpp loads libgomp)
import llama_cpp  # noqa: F401  isort: skip  (before llguidance, see above)
from llguidance import LLMatcher, LLTokenizer, TokenizerWrapper  # isort: skip
from llguidance.numpy import fill_next_token_bitmask  # isort: skip

__all__ = ["LLMatcher", "LLTokenizer", "TokenizerWrapper", "fill_next_token_bitmask"]
