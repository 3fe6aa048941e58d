"""The real Codex CLI (pinned in scripts/setup.sh) against kinfer's Responses API.

Codex speaks Responses only, sends `store: false` with its whole history each turn, a ~10k-token
prompt, function tools (`exec_command` is its shell), `namespace` tool groups and hosted tools. A turn
and a shell round trip run through the scripted engine with a large context (only the model's words
are scripted); on the real bundled model its prompt does not fit, and Codex must stop after one
request with its context-window message (it retries a 413 five times).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.live_server import LiveServer
from tests.server.agent_clis import finished_requests, run_codex
from tests.server.dialect_helpers import template

pytestmark = pytest.mark.slow

BIG_CONTEXT = {"ctx": 400_000}  # the scripted engine's tokens are characters
QWEN3 = template("qwen3-0.6b.jinja")
SHELL_CALL = "<tool_call>\n" + json.dumps({"name": "exec_command", "arguments": {"cmd": "echo kinfer-ok"}})
SHELL_CALL += "\n</tool_call>"
CONTEXT_WINDOW_MESSAGE = "ran out of room in the model's context window"


def test_a_turn_is_answered(scripted, tmp_path: Path):
    with scripted(lambda prompt: "Hi from kinfer.", engine=BIG_CONTEXT) as s:
        result = run_codex(s.url, "Say hi", home=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.last_message.strip() == "Hi from kinfer."
    assert len(s.prompts) == 1


def test_a_shell_tool_round_trip(scripted, tmp_path: Path):
    """The model calls exec_command; Codex runs `echo kinfer-ok` in its sandbox, sends the output back
    as a function_call_output, and the model answers."""

    def model(prompt: str) -> str:
        if "kinfer-ok" in prompt[prompt.rfind("<tool_response>") :]:
            return "The command printed kinfer-ok."
        return SHELL_CALL

    with scripted(model, QWEN3, engine=BIG_CONTEXT) as s:
        result = run_codex(s.url, "Run echo kinfer-ok in the shell.", home=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.last_message.strip() == "The command printed kinfer-ok."
    assert len(s.prompts) == 2
    answered = s.prompts[1]
    assert '"name": "exec_command"' in answered  # the call, replayed from Codex's own items
    output = answered[answered.rindex("<tool_response>") :]
    assert "Process exited with code 0" in output and "Output:\nkinfer-ok" in output  # it really ran


def test_on_the_bundled_model_one_request_then_its_context_window_message(
    smol_server: LiveServer, tmp_path: Path
):
    requests = finished_requests(smol_server)
    result = run_codex(smol_server.url, "Say hi", home=tmp_path)
    assert result.returncode != 0
    assert CONTEXT_WINDOW_MESSAGE in result.stderr + result.stdout
    assert len(requests) == 1  # a 400 context_length_exceeded stops it at once; a 413 it retries 5 times
