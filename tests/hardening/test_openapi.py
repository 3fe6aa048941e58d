"""GET /openapi.json: every route of the app, bodies from the dialects' own wire models, behind the key."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import schemathesis

from kinfer.server.app import create_app
from kinfer.server.dialects import dialect_for
from kinfer.server.openapi import SKIPPED_ENDPOINTS, SKIPPED_METHODS, openapi_path, undocumented_bodies
from tests.live_server import LiveServer, running_server, server_settings
from tests.scripted_engine import ScriptedEngine


def scripted(model, settings, ctx) -> ScriptedEngine:
    return ScriptedEngine(lambda prompt: "A scripted reply.", rows=2)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> LiveServer:
    home = tmp_path_factory.mktemp("kinfer-home")
    mp = pytest.MonkeyPatch()
    mp.setenv("OLLAMA_MODELS", str(home / "no-ollama"))
    with running_server(server_settings(home), engine_factory=scripted) as live:
        yield live
    mp.undo()


@pytest.fixture(scope="module")
def spec(server: LiveServer) -> dict:
    reply = httpx.get(server.url + "/openapi.json", timeout=30)
    assert reply.status_code == 200
    return reply.json()


def app_routes(server: LiveServer) -> list[tuple[str, str]]:
    app = create_app(server.runtime)  # the same factory, so the same url map the server runs
    return [
        (method, rule.rule)
        for rule in app.url_map.iter_rules()
        if rule.endpoint not in SKIPPED_ENDPOINTS
        for method in sorted((rule.methods or set()) - SKIPPED_METHODS)
    ]


def test_every_route_of_the_app_is_in_the_spec(server: LiveServer, spec: dict):
    routes = app_routes(server)
    assert len(routes) > 20
    missing = [f"{m} {r}" for m, r in routes if m.lower() not in spec["paths"].get(openapi_path(r), {})]
    assert missing == []
    documented = {(m.upper(), p) for p, ops in spec["paths"].items() for m in ops}
    assert documented == {(m, openapi_path(r)) for m, r in routes}, "the spec lists a route the app lacks"


def test_every_route_that_reads_a_body_documents_its_wire_model(server: LiveServer, spec: dict):
    assert undocumented_bodies(create_app(server.runtime)) == []
    for path, operations in spec["paths"].items():
        if "post" in operations:
            ref = operations["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
            assert ref.split("/")[-1] in spec["components"]["schemas"], (path, ref)


def test_the_documented_body_is_the_enforced_one(server: LiveServer, spec: dict):
    schemas = spec["components"]["schemas"]
    chat = schemas["ChatCompletionRequest"]
    assert "messages" in chat["required"]
    assert chat["properties"]["temperature"]["anyOf"][0]["maximum"] == 2
    # what the schema calls required, the server requires
    reply = httpx.post(server.url + "/v1/chat/completions", json={"model": "x"}, timeout=30)
    assert reply.status_code == 400 and "messages" in reply.json()["error"]["message"]
    messages = schemas["MessagesBody"]
    assert {"messages", "max_tokens"} <= set(messages["required"])


def test_errors_are_described_in_each_dialects_envelope(spec: dict):
    ollama = spec["paths"]["/api/chat"]["post"]["responses"]["4XX"]["content"]["application/json"]["schema"]
    anthropic = spec["paths"]["/v1/messages"]["post"]["responses"]["4XX"]["content"]["application/json"]
    openai = spec["paths"]["/v1/chat/completions"]["post"]["responses"]["4XX"]["content"]["application/json"]
    assert ollama["properties"]["error"] == {"type": "string"}
    assert anthropic["schema"]["properties"]["type"] == {"const": "error"}
    assert "error" in openai["schema"]["required"]
    for path, operations in spec["paths"].items():  # each from the dialect that renders the path's errors
        for operation in operations.values():
            error = operation["responses"]["4XX"]["content"]["application/json"]["schema"]
            assert error == dialect_for(path).error_schema, path


def test_streaming_routes_name_their_stream_type(spec: dict):
    chat = spec["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["content"]
    ollama = spec["paths"]["/api/chat"]["post"]["responses"]["200"]["content"]
    assert "text/event-stream" in chat and "application/x-ndjson" in ollama


def test_schemathesis_reads_the_spec_as_openapi_3_1(spec: dict):
    assert spec["openapi"].startswith("3.1")
    schema = schemathesis.openapi.from_dict(spec)
    labels = {result.ok().label for result in schema.get_all_operations()}
    assert {"POST /v1/chat/completions", "POST /api/chat", "GET /v1/models/{name}"} <= labels


def test_the_spec_is_behind_the_api_key_and_health_is_not(tmp_path: Path):
    with running_server(server_settings(tmp_path, api_key="k3y"), engine_factory=scripted) as locked:
        assert httpx.get(locked.url + "/openapi.json").status_code == 401
        opened = httpx.get(locked.url + "/openapi.json", headers={"Authorization": "Bearer k3y"})
        assert opened.status_code == 200
        assert opened.json()["paths"]["/health"]["get"]["security"] == []
