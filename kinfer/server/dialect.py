"""What a dialect module declares to the app: its routes, the paths it answers errors on, its envelope.

Each dialect module (`openai_chat`, `ollama`, `anthropic`, `responses`) ends with one
`DIALECT = Dialect(...)`; `dialects.DIALECTS` lists them, and the app registers, routes errors and
documents error envelopes from that one list. This module imports no dialect.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from quart import Blueprint, Response

from kinfer.errors import KinferError

ErrorRenderer = Callable[[KinferError], Response]


@dataclass(frozen=True)
class Dialect:
    """One API dialect as the app sees it."""

    name: str
    # the paths whose errors (unknown routes under them included) this dialect renders; the longest
    # matching prefix wins, so OpenAI's "/" takes every path no other dialect claims
    prefixes: tuple[str, ...]
    blueprint: Blueprint
    error_response: ErrorRenderer
    error_schema: Mapping[str, Any]  # JSON schema of `error_response`'s body, for /openapi.json
