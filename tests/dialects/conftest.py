"""Servers for the dialect tests: the real bundled SmolLM2, and the scripted engine for exact output.

The scripted engine runs behind the real scheduler, chat template, output pipeline and HTTP server;
only the model's words are chosen by the test (see tests/scripted_engine.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.live_server import LiveServer, running_server, server_settings
from tests.scripted_engine import ScriptedEngine

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


@pytest.fixture(scope="module")
def smol_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """The real server on the real bundled SmolLM2-135M GGUF (llama.cpp)."""
    home = tmp_path_factory.mktemp("kinfer-home")
    mp = pytest.MonkeyPatch()
    mp.setenv("OLLAMA_MODELS", str(home / "no-ollama"))
    try:
        with running_server(server_settings(home, parallel=2, ctx=4096)) as server:
            yield server
    finally:
        mp.undo()


class Scripted:
    """A running server whose model says `reply(prompt)`; `prompts` records every prompt it was given."""

    def __init__(self, server: LiveServer, prompts: list[str]) -> None:
        self.server = server
        self.prompts = prompts

    @property
    def url(self) -> str:
        return self.server.url


@pytest.fixture
def scripted(kinfer_home: Path):
    """`with scripted(reply, template=...) as s:` a real server whose engine writes `reply(prompt)`."""

    @contextmanager
    def start(
        reply: Callable[[str], str],
        template: str | None = None,
        *,
        engine: dict | None = None,
        **settings: object,
    ) -> Iterator[Scripted]:
        """`engine`: more ScriptedEngine arguments (ctx, fail_on); `settings`: Settings overrides."""
        prompts: list[str] = []

        def recorded(prompt: str) -> str:
            prompts.append(prompt)
            return reply(prompt)

        def factory(model, _settings, ctx):
            kwargs = dict(engine or {})
            if template is not None:
                kwargs["template"] = template
            return ScriptedEngine(reply=recorded, **kwargs)

        with running_server(server_settings(kinfer_home, **settings), engine_factory=factory) as server:
            yield Scripted(server, prompts)

    return start


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
            elif line.startswith("data: "):
                data = json.loads(line.removeprefix("data: "))
        if data is not None:
            events.append((name, data))
    return events
