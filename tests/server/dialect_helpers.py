"""What the dialect tests share: tool-call texts as models write them, the chat templates saved under
tests/fixtures/templates, scripted replies, and a server-sent-events reader."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tests.live_server import LiveServer

TEMPLATES = Path(__file__).resolve().parent.parent / "fixtures" / "templates"

# What a Hermes model (Qwen2.5/Qwen3) writes to call a tool, and what Qwen3.5 writes (XML).
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
XML_CALL = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
)
WEATHER_REPORT = "18°C and sunny"
FINAL_ANSWER = "It is 18°C and sunny in Paris."

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "description": "City name"}},
    "required": ["city"],
}


def template(name: str) -> str:
    return (TEMPLATES / name).read_text(encoding="utf-8")


class Scripted:
    """A running server whose model says `reply(prompt)`; `prompts` records every prompt it was given."""

    def __init__(self, server: LiveServer, prompts: list[str]) -> None:
        self.server = server
        self.prompts = prompts

    @property
    def url(self) -> str:
        return self.server.url


def weather_then_answer(call: str, *, thinking: str = "") -> Callable[[str], str]:
    """A model that calls get_weather, then answers once the tool's result is in the prompt;
    `thinking` comes first both times."""

    def reply(prompt: str) -> str:
        if WEATHER_REPORT in prompt:
            return thinking + FINAL_ANSWER
        return thinking + call

    return reply


def read_sse(text: str) -> list[tuple[str | None, dict]]:
    """(event name, JSON data) for each server-sent event in a whole response body."""
    events = []
    for block in text.split("\n\n"):
        name, data = None, None
        for line in block.splitlines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: ") and line != "data: [DONE]":
                data = json.loads(line.removeprefix("data: "))
        if data is not None:
            events.append((name, data))
    return events
