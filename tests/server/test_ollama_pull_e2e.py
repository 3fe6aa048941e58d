"""Ollama's /api/pull streams the store's pull progress from the (fake, local) Hugging Face Hub."""

from __future__ import annotations

import json

import httpx
import ollama
import pytest

from tests.fixtures.hub_server import FakeRepo, HubServer
from tests.fixtures.tiny_gguf import write_tiny_gguf
from tests.live_server import running_server, server_settings


@pytest.fixture
def hub(tmp_path, monkeypatch):
    (gguf,) = write_tiny_gguf(tmp_path / "src" / "tiny-Q4_K_M.gguf")
    repo = FakeRepo({"tiny-Q4_K_M.gguf": gguf.read_bytes()})
    with HubServer({"acme/tiny-GGUF": repo}) as server:
        server.patch_env(monkeypatch, token_dir=str(tmp_path / "hf"))
        yield server


def test_api_pull_streams_progress_then_lists_the_model(hub, tmp_path):
    with running_server(server_settings(tmp_path / "home")) as server:
        with httpx.stream(
            "POST", server.url + "/api/pull", json={"model": "hf.co/acme/tiny-GGUF"}, timeout=60
        ) as reply:
            lines = [json.loads(line) for line in reply.iter_lines() if line]
        statuses = [line["status"] for line in lines]
        assert statuses[-1] == "success"
        assert any("total" in line and "completed" in line for line in lines)
        names = [m.model for m in ollama.Client(host=server.url).list().models]
        assert "hf.co/acme/tiny-GGUF:q4_k_m" in names


def test_api_pull_of_a_missing_repo_says_so(hub, tmp_path):
    with running_server(server_settings(tmp_path / "home")) as server:
        with pytest.raises(ollama.ResponseError) as failed:
            ollama.Client(host=server.url).pull("hf.co/acme/nothing-here", stream=False)
        assert failed.value.status_code == 404
