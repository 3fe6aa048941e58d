"""One real server on the bundled SmolLM2, shared by the end-to-end tests of a module."""

from __future__ import annotations

import pytest

from tests.live_server import LiveServer, running_server, server_settings


@pytest.fixture(scope="module")
def smol_server(tmp_path_factory: pytest.TempPathFactory) -> LiveServer:
    home = tmp_path_factory.mktemp("kinfer-home")
    mp = pytest.MonkeyPatch()
    mp.setenv("OLLAMA_MODELS", str(home / "no-ollama"))
    with running_server(server_settings(home, parallel=4, ctx=2048)) as server:
        yield server
    mp.undo()
