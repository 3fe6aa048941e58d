"""The real Claude Code CLI (pinned in scripts/setup.sh) against kinfer, with its default tool set.

By default Claude Code sends its Agent and Skill tools and a `role: "system"` message after the user's
turn (the agent and skill lists); its prompt is ~12k tokens, more than the bundled SmolLM2's row. So a
whole turn, and a Bash round trip, run through the scripted engine with a large context (only the
model's words are scripted; template, HTTP, SSE and Claude Code itself are real), and on the real
bundled model Claude Code must show its own "Prompt is too long", not an API error.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.live_server import LiveServer
from tests.server.agent_clis import finished_requests, run_claude
from tests.server.dialect_helpers import template

pytestmark = pytest.mark.slow

BIG_CONTEXT = {"ctx": 400_000}  # the scripted engine's tokens are characters
QWEN3 = template("qwen3-0.6b.jinja")
# Claude Code asks for effort "high", so the prompt opens Qwen3's think block: the model closes it first
THOUGHT = "The user wants a command run.\n</think>\n\n"
BASH_CALL = '<tool_call>\n{"name": "Bash", "arguments": {"command": "echo kinfer-ok"}}\n</tool_call>'


def assert_system_turn_after_the_user_turn(prompt: str) -> None:
    """Its agent and skill lists came as a system message after the user's turn and went into the
    prompt as a system turn of their own, there. (Refused with a 400, Claude Code 2.1.332 sends the
    request again with that text moved into the user's turn instead.)"""
    user_at = prompt.index("<|im_start|>user\n")
    system_at = prompt.find("<|im_start|>system\n# Environment")
    assert user_at < system_at < prompt.rindex("<|im_start|>assistant\n"), prompt[-3000:]
    assert "Available agent types for the Agent tool" in prompt[system_at:]


def test_a_default_turn_with_its_mid_conversation_system_message_is_answered(scripted, tmp_path: Path):
    with scripted(lambda prompt: "Hi from kinfer.", engine=BIG_CONTEXT) as s:
        result = run_claude(s.url, "Say hi", home=tmp_path)
    reply = result.json
    assert not reply["is_error"], reply
    assert reply["result"] == "Hi from kinfer."
    assert len(s.prompts) == 1
    assert_system_turn_after_the_user_turn(s.prompts[0])


def test_a_bash_tool_round_trip(scripted, tmp_path: Path):
    """The model asks for Bash; Claude Code runs `echo kinfer-ok` and sends the result; the model answers."""

    def model(prompt: str) -> str:
        if "<tool_response>\nkinfer-ok" in prompt:
            return THOUGHT + "The command printed kinfer-ok."
        return THOUGHT + BASH_CALL

    with scripted(model, QWEN3, engine=BIG_CONTEXT) as s:
        result = run_claude(
            s.url, "Run echo kinfer-ok with Bash.", "--allowedTools", "Bash(echo:*)", home=tmp_path
        )
    reply = result.json
    assert not reply["is_error"], reply
    assert reply["result"] == "The command printed kinfer-ok."
    assert reply["num_turns"] == 2
    assert len(s.prompts) == 2
    assert '"name": "Bash"' in s.prompts[1] and "<tool_response>\nkinfer-ok" in s.prompts[1]
    assert_system_turn_after_the_user_turn(s.prompts[0])


def test_on_the_bundled_model_it_shows_prompt_is_too_long(smol_server: LiveServer, tmp_path: Path):
    """Its default prompt does not fit SmolLM2's row: one 400 in Anthropic's words, which Claude Code
    turns into its own "Prompt is too long" (a 413 would read "Request too large")."""
    requests = finished_requests(smol_server)
    result = run_claude(smol_server.url, "Say hi", home=tmp_path)
    reply = result.json
    assert reply["is_error"] and reply["api_error_status"] == 400, reply
    assert reply["result"].startswith("Prompt is too long"), reply["result"]
    assert "API Error" not in reply["result"] and "Request too large" not in reply["result"]
    assert len(requests) == 1
