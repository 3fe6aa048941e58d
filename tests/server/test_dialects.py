"""The one list of dialects: what the app registers, and whose envelope an error is rendered in.

A path belongs to the dialect with the longest matching prefix; OpenAI's "/" takes the rest (unknown
routes, /health). Driven over HTTP against the real server (no model is loaded for these).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kinfer.server import anthropic, ollama, openai_chat, responses
from kinfer.server.app import create_app
from kinfer.server.dialects import DIALECTS, dialect_for
from kinfer.server.responses_store import ResponseStore
from tests.live_server import LiveServer, running_server, server_settings


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    home: Path = tmp_path_factory.mktemp("kinfer-home")
    mp = pytest.MonkeyPatch()
    mp.setenv("OLLAMA_MODELS", str(home / "no-ollama"))
    try:
        with running_server(server_settings(home)) as live:
            yield live
    finally:
        mp.undo()


def test_the_app_registers_exactly_the_listed_dialects(server: LiveServer) -> None:
    assert DIALECTS == (openai_chat.DIALECT, ollama.DIALECT, anthropic.DIALECT, responses.DIALECT)
    app = create_app(server.runtime)
    assert set(app.blueprints) == {d.blueprint.name for d in DIALECTS}
    assert len({d.name for d in DIALECTS}) == len(DIALECTS)


def test_each_app_keeps_its_own_stored_responses(server: LiveServer) -> None:
    # made when the Responses blueprint registers: it lives (and goes away) with its server
    first, second = create_app(server.runtime), create_app(server.runtime)
    assert isinstance(first.extensions[responses.STORE_KEY], ResponseStore)
    assert first.extensions[responses.STORE_KEY] is not second.extensions[responses.STORE_KEY]


@pytest.mark.parametrize(
    ("path", "dialect"),
    [
        ("/v1/chat/completions", "openai"),
        ("/v1/models/x", "openai"),
        ("/health", "openai"),
        ("/no/such/route", "openai"),
        ("/api/chat", "ollama"),
        ("/api/no-such-route", "ollama"),
        ("/v1/messages", "anthropic"),
        ("/v1/messages/count_tokens", "anthropic"),
        ("/v1/responses/resp_1", "responses"),
        ("/responses", "responses"),  # the unversioned alias Codex-style base URLs reach
    ],
)
def test_a_path_belongs_to_the_dialect_of_its_longest_prefix(path: str, dialect: str) -> None:
    assert dialect_for(path).name == dialect


@pytest.mark.parametrize(
    ("path", "envelope"),
    [
        ("/api/no-such-route", {"error": "no route GET /api/no-such-route"}),
        (
            "/v1/messages/no-such-route",
            {
                "type": "error",
                "error": {"type": "not_found_error", "message": "no route GET /v1/messages/no-such-route"},
            },
        ),
        (
            "/v1/responses/resp_unknown",
            {
                "error": {
                    "message": "Response with id 'resp_unknown' not found.",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": None,  # OpenAI's codes are strings or null, never the HTTP status
                }
            },
        ),
        (
            "/no-such-route",
            {
                "error": {
                    "message": "no route GET /no-such-route",
                    "type": "invalid_request_error",  # OpenAI's type for an unknown route or model
                    "param": None,
                    "code": None,
                }
            },
        ),
    ],
)
def test_an_error_is_answered_in_the_envelope_of_its_paths_dialect(
    server: LiveServer, path: str, envelope: dict
) -> None:
    reply = httpx.get(server.url + path, timeout=30)
    assert reply.status_code == 404
    body = reply.json()
    if path.startswith("/v1/messages"):  # Anthropic's request id, in the body and the header
        assert body.pop("request_id") == reply.headers["request-id"]
    assert body == envelope


@pytest.mark.parametrize("path", ["/v1/responses", "/responses"])
def test_a_responses_error_carries_its_param_and_code(server: LiveServer, path: str) -> None:
    # Responses renders its own errors: OpenAI's envelope, with the param and code OpenAI sends
    body = {"model": "m", "input": "hi", "previous_response_id": "resp_nope"}
    reply = httpx.post(server.url + path, json=body, timeout=30)
    assert reply.status_code == 404
    error = reply.json()["error"]
    assert (error["param"], error["code"]) == ("previous_response_id", "previous_response_not_found")
