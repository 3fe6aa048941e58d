"""The door: API key on every route but /health, in each dialect's error shape, and CORS."""

from __future__ import annotations

import httpx
import pytest

from tests.live_server import LiveServer, running_server, server_settings

KEY = "s3cret-key"


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory) -> LiveServer:
    home = tmp_path_factory.mktemp("kinfer-home")
    settings = server_settings(home, api_key=KEY, origins="http://localhost,https://app.example.com:8443")
    with running_server(settings) as server:
        yield server


def test_health_is_open_and_everything_else_needs_the_key(locked: LiveServer):
    assert httpx.get(locked.url + "/health").status_code == 200
    assert httpx.get(locked.url + "/v1/models").status_code == 401
    assert httpx.get(locked.url + "/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(locked.url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert httpx.get(locked.url + "/api/tags", headers={"x-api-key": KEY}).status_code == 200


def test_refusals_speak_the_callers_dialect(locked: LiveServer):
    openai_error = httpx.get(locked.url + "/v1/models").json()
    assert openai_error["error"]["type"] == "authentication_error"
    ollama_error = httpx.get(locked.url + "/api/tags").json()
    assert "API key" in ollama_error["error"]
    anthropic = httpx.post(locked.url + "/v1/messages", json={}).json()
    assert anthropic.get("type") == "error" or "error" in anthropic


def test_kinfer_ps_without_the_key_says_the_server_wants_one(
    locked: LiveServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
):
    from kinfer import cli

    monkeypatch.delenv("KINFER_API_KEY", raising=False)
    assert cli.main(["ps", "--port", str(locked.port)]) == 1
    out, err = capsys.readouterr()
    assert out == ""  # never "no model loaded": the server did not say what it has loaded
    assert "needs an API key (401)" in err and "KINFER_API_KEY" in err

    monkeypatch.setenv("KINFER_API_KEY", KEY)
    assert cli.main(["ps", "--port", str(locked.port)]) == 0
    assert capsys.readouterr().out.strip() == "no model loaded"


def test_cors_admits_configured_origins_only(locked: LiveServer):
    preflight = httpx.options(
        locked.url + "/v1/chat/completions",
        headers={
            "Origin": "http://localhost:3000",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
    )
    assert preflight.status_code == 204
    assert preflight.headers["access-control-allow-origin"] == "http://localhost:3000"
    assert "authorization" in preflight.headers["access-control-allow-headers"]
    exact = httpx.get(locked.url + "/health", headers={"Origin": "https://app.example.com:8443"})
    assert exact.headers["access-control-allow-origin"] == "https://app.example.com:8443"
    stranger = httpx.get(locked.url + "/health", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in stranger.headers
    wrong_port = httpx.get(locked.url + "/health", headers={"Origin": "https://app.example.com:9999"})
    assert "access-control-allow-origin" not in wrong_port.headers


def test_it_binds_loopback_by_default():
    from kinfer.config import Settings

    assert Settings().host == "127.0.0.1"


def test_an_oversized_body_is_a_413(tmp_path):
    with running_server(server_settings(tmp_path, max_body_mb=0.01)) as server:
        reply = httpx.post(
            server.url + "/v1/chat/completions",
            content=b"x" * 20_000,
            headers={"content-type": "application/json"},
        )
        assert reply.status_code == 413
        assert reply.json()["error"]["type"] == "request_too_large"
