"""llguidance's names for modules outside this package, loaded after libllama (see __init__)."""

from __future__ import annotations

from llguidance import LLTokenizer, TokenizerWrapper

__all__ = ["LLTokenizer", "TokenizerWrapper"]
