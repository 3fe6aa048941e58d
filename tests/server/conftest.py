"""Servers for the end-to-end tests of every dialect: the real bundled SmolLM2, and the scripted
engine for exact output.

The scripted engine runs behind the real scheduler, chat template, output pipeline and HTTP server;
only the model's words are chosen by the test (see tests/scripted_engine.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.live_server import LiveServer, running_server, server_settings
from tests.scripted_engine import ScriptedEngine
from tests.server.dialect_helpers import Scripted


@pytest.fixture(scope="module")
def smol_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """The real server on the real bundled SmolLM2-135M GGUF (llama.cpp)."""
    home = tmp_path_factory.mktemp("kinfer-home")
    mp = pytest.MonkeyPatch()
    mp.setenv("OLLAMA_MODELS", str(home / "no-ollama"))
    try:
        with running_server(server_settings(home, parallel=4, ctx=4096)) as server:
            yield server
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def mlx_server(smollm_f32, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """The real server on SmolLM2 in float32 on the MLX engine (the same weights as the bundled GGUF),
    whatever model name a request gives."""
    from kinfer.engines.mlx.engine import MlxEngine

    home = tmp_path_factory.mktemp("kinfer-home")
    mp = pytest.MonkeyPatch()
    mp.setenv("OLLAMA_MODELS", str(home / "no-ollama"))

    def mlx_engine(model, settings, ctx):
        return MlxEngine(smollm_f32.hf_dir, name=model.name, rows=4, ctx=1024)

    try:
        with running_server(server_settings(home), engine_factory=mlx_engine) as server:
            yield server
    finally:
        mp.undo()


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
