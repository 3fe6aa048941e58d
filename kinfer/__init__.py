"""kinfer: a local LLM server with a model store and a live dashboard."""

__version__ = "0.1.0"
