"""docs/api.md's request-field tables and the code stay in step.

Every field of a route's wire model is in the route's table, as honoured, ignored or refused; a row
the wire model does not have is an extra, which is always accepted and ignored; and every refused
field really gets a 400 (each has a probe below: a refused row without one fails here, so the doc
cannot claim a refusal nobody checked). Ignored extras are sent too, and must be accepted.
"""

from __future__ import annotations

import copy
import re
import typing
from pathlib import Path
from typing import Any

import httpx
import pytest

from kinfer.server.anthropic_wire import MessagesBody
from kinfer.server.ollama_wire import ChatBody, GenerateBody
from kinfer.server.openai_wire import ChatCompletionRequest, CompletionRequest
from kinfer.server.responses_wire import ResponsesBody
from kinfer.server.wire import WireModel
from tests.live_server import running_server, server_settings
from tests.scripted_engine import ScriptedEngine

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
STATES = ("honoured", "ignored", "refused")
HI = [{"role": "user", "content": "Hi."}]

# route -> (its wire model, a small body it answers with a 200)
ROUTES: dict[str, tuple[type[WireModel], dict[str, Any]]] = {
    "POST /v1/chat/completions": (
        ChatCompletionRequest,
        {"model": "smollm2", "messages": HI, "max_tokens": 4},
    ),
    "POST /v1/completions": (CompletionRequest, {"model": "smollm2", "prompt": "Hi", "max_tokens": 4}),
    "POST /api/chat": (
        ChatBody,
        {"model": "smollm2", "messages": HI, "stream": False, "options": {"num_predict": 4}},
    ),
    "POST /api/generate": (
        GenerateBody,
        {"model": "smollm2", "prompt": "Hi.", "stream": False, "options": {"num_predict": 4}},
    ),
    "POST /v1/messages": (
        MessagesBody,
        {
            "model": "smollm2",
            "max_tokens": 4,
            "system": [{"type": "text", "text": "Be brief."}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi."}]}],
            "tools": [{"name": "noop", "description": "Nothing.", "input_schema": {"type": "object"}}],
        },
    ),
    "POST /v1/responses": (
        ResponsesBody,
        {
            "model": "smollm2",
            "max_output_tokens": 4,
            "input": [
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi."}]}
            ],
        },
    ),
}

# (route, refused field) -> what to add to the route's body to ask for the refused feature
REFUSED: dict[tuple[str, str], dict[str, Any]] = {
    ("POST /v1/completions", "suffix"): {"suffix": "end"},
    ("POST /api/chat", "messages.images"): {
        "messages": [{"role": "user", "content": "Hi.", "images": ["aGk="]}]
    },
    ("POST /api/generate", "suffix"): {"suffix": "end"},
    ("POST /api/generate", "images"): {"images": ["aGk="]},
}


def doc_tables() -> dict[str, dict[str, str]]:
    """route -> {field: state} from the doc's `#### Request fields: `ROUTE`` tables."""
    tables: dict[str, dict[str, str]] = {}
    route = None
    for line in DOC.read_text(encoding="utf-8").splitlines():
        heading = re.fullmatch(r"#### Request fields: `([A-Z]+ \S+)`", line)
        if heading:
            route = heading[1]
            tables[route] = {}
            continue
        row = re.fullmatch(r"\| `([^`]+)` \| (\w+) \|.*\|", line)
        if route is not None and row:
            assert row[1] not in tables[route], f"{row[1]} is listed twice for {route}"
            tables[route][row[1]] = row[2]
        elif route is not None and not line.startswith("|") and tables[route]:
            route = None  # the table ended
    return tables


def wire_fields(model: type[WireModel], prefix: str = "", path: tuple[type, ...] = ()) -> list[str]:
    """Every field of `model` as a dotted path, nested models included (a model that contains itself,
    such as a tool_result's content blocks, is listed once)."""
    out = []
    for name, info in model.model_fields.items():
        field = prefix + (info.alias or name)
        out.append(field)
        for sub in _models_in(info.annotation):
            if sub not in (*path, model):
                out += wire_fields(sub, field + ".", (*path, model))
    return out


def _models_in(annotation: Any) -> list[type[WireModel]]:
    if isinstance(annotation, type) and issubclass(annotation, WireModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


TABLES = doc_tables()


def test_every_route_with_a_wire_model_has_a_table() -> None:
    assert set(TABLES) == set(ROUTES)


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_every_wire_field_is_in_the_table_with_one_of_the_three_states(route: str) -> None:
    model, _ = ROUTES[route]
    table = TABLES[route]
    missing = [field for field in wire_fields(model) if field not in table]
    assert not missing, f"docs/api.md does not say what {route} does with {missing}"
    assert {state for state in table.values()} <= set(STATES)


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_a_row_the_wire_model_lacks_is_an_ignored_extra(route: str) -> None:
    fields = set(wire_fields(ROUTES[route][0]))
    wrong = {
        field: state for field, state in TABLES[route].items() if field not in fields and state != "ignored"
    }
    assert not wrong, f"{route}: these are not wire fields, so kinfer can only ignore them: {wrong}"


def test_every_refused_row_has_a_probe_and_every_probe_a_refused_row() -> None:
    documented = {
        (route, field) for route, table in TABLES.items() for field, s in table.items() if s == "refused"
    }
    assert documented == set(REFUSED)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("kinfer-home")
    mp = pytest.MonkeyPatch()
    mp.setenv("OLLAMA_MODELS", str(home / "no-ollama"))
    try:
        with running_server(
            server_settings(home), engine_factory=lambda model, s, ctx: ScriptedEngine(lambda prompt: "ok")
        ) as live:
            yield live
    finally:
        mp.undo()


def post(server, route: str, body: dict[str, Any]) -> httpx.Response:
    _method, path = route.split(" ")
    return httpx.post(server.url + path, json=body, timeout=60)


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_the_plain_body_is_answered(server, route: str) -> None:
    assert post(server, route, ROUTES[route][1]).status_code == 200


@pytest.mark.parametrize(("route", "field"), sorted(REFUSED))
def test_a_refused_field_gets_a_400(server, route: str, field: str) -> None:
    reply = post(server, route, {**ROUTES[route][1], **REFUSED[route, field]})
    assert reply.status_code == 400, reply.text


EXTRAS = sorted(
    (route, field)
    for route, table in TABLES.items()
    for field, state in table.items()
    if state == "ignored" and field not in set(wire_fields(ROUTES[route][0]))
)


@pytest.mark.parametrize(("route", "field"), EXTRAS)
def test_an_ignored_extra_is_accepted(server, route: str, field: str) -> None:
    assert post(server, route, with_value(ROUTES[route][1], field, 1)).status_code == 200


def with_value(body: dict[str, Any], field: str, value: Any) -> dict[str, Any]:
    """`body` with `field` (dotted; a list stands for its first element) set to `value`."""
    body = copy.deepcopy(body)
    node: Any = body
    *parents, leaf = field.split(".")
    for key in parents:
        node = node.setdefault(key, {})
        if isinstance(node, list):
            node = node[0]
    node[leaf] = value
    return body
