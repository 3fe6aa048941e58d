"""kinfer: a local LLM server with a model store and a live dashboard."""

from kinfer import libllama_first  # noqa: F401  (before anything loads numpy: see that module)

__version__ = "0.1.0"
