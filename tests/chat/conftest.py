"""Fixtures for the chat tests: the real chat templates saved under tests/fixtures/templates."""

from __future__ import annotations

import pytest

from tests.chat.chat_helpers import load_template


@pytest.fixture(scope="session")
def qwen3_template() -> str:
    """Qwen3-0.6B's template: Hermes tool calls, an `enable_thinking` switch, no opener by default."""
    return load_template("qwen3-0.6b.jinja")


@pytest.fixture(scope="session")
def qwen35_template() -> str:
    """Qwen3.5's template: XML tool calls, always opens `<think>` unless thinking is switched off."""
    return load_template("qwen3.5-4b.jinja")
