"""The llama.cpp engine's wing: GGUF files served through llama-cpp-python's low-level API.

Only `native.py` imports `llama_cpp`; this package's __init__ imports nothing, so `sizing` can be
read (by can-run, bench) without loading libllama.
"""
