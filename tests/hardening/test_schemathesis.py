"""Property-based fuzzing of every route from /openapi.json (schemathesis 4): no 5xx, no hang.

Two runs against the live server: every operation, valid and invalid bodies, on the scripted engine
(fast); then the generation routes on the real SmolLM2 with small budgets. The examples are bounded
and derandomised, and each request has a timeout, so a hang fails the test rather than stalling it.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from tests.fixtures.hub_server import HubServer
from tests.live_server import LiveServer, running_server, server_settings
from tests.scripted_engine import ScriptedEngine

REQUEST_TIMEOUT_S = 20
GENERATION_ROUTES = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/messages",
    "/v1/responses",
    "/api/chat",
    "/api/generate",
)


def scripted(model, settings_, ctx) -> ScriptedEngine:
    return ScriptedEngine(lambda prompt: "A short scripted reply.", rows=4)


def fuzz(
    server: LiveServer,
    spec: dict,
    *,
    examples: int,
    modes: tuple[GenerationMode, ...],
    paths: tuple[str, ...] | None = None,
    tame: Callable[[object], None] | None = None,
) -> int:
    """Run every operation's strategy for `examples` examples per mode; returns the requests sent."""
    schema = schemathesis.openapi.from_dict(spec)
    sent: list[int] = []
    failures: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        if paths is not None and operation.path not in paths:
            continue
        for mode in modes:
            try:
                fuzz_operation(server, operation, mode, examples, tame, sent, failures)
            except Unsatisfiable:
                # an operation with nothing to get wrong (GET /health) has no invalid cases
                assert mode is GenerationMode.NEGATIVE, operation.label
    assert failures == [], "\n".join(failures[:10])
    return len(sent)


def fuzz_operation(server, operation, mode, examples, tame, sent: list[int], failures: list[str]) -> None:
    label = f"{operation.label} [{mode.value}]"

    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=(Phase.generate,),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def check(case) -> None:
        if tame is not None:
            tame(case)
        response = case.call(base_url=server.url, timeout=REQUEST_TIMEOUT_S)
        sent.append(response.status_code)
        if response.status_code >= 500:
            failures.append(
                f"{label} -> {response.status_code}: {response.text[:200]} (body {str(case.body)[:200]})"
            )

    check()


@pytest.fixture
def empty_hub(tmp_path, monkeypatch: pytest.MonkeyPatch):
    # /api/pull is fuzzed too: it must reach a hub of ours (with no repos), never the real one
    with HubServer() as hub:
        hub.patch_env(monkeypatch, token_dir=str(tmp_path))
        yield hub


def test_no_operation_answers_a_5xx_on_the_scripted_engine(tmp_path, empty_hub, monkeypatch):
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-ollama"))
    with running_server(server_settings(tmp_path / "home"), engine_factory=scripted) as server:
        spec = httpx.get(server.url + "/openapi.json", timeout=30).json()
        sent = fuzz(server, spec, examples=12, modes=(GenerationMode.POSITIVE, GenerationMode.NEGATIVE))
        assert sent > 200
        assert httpx.get(server.url + "/health", timeout=10).json()["status"] == "ok"


def tame(case) -> None:
    """Small budgets on the real model, and no per-request context or unload: the engine takes an
    explicit context as given (see docs/reliability.md), so a fuzzed num_ctx could exhaust memory."""
    body = case.body
    if not isinstance(body, dict):
        return
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        if isinstance(body.get(key), int):
            body[key] = max(1, min(body[key], 4))
    body.pop("keep_alive", None)
    if isinstance(body.get("options"), dict):
        body["options"].pop("num_ctx", None)
        body["options"]["num_predict"] = 4


@pytest.mark.slow
def test_the_generation_routes_never_answer_a_5xx_on_the_real_model(tmp_path, monkeypatch):
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-ollama"))
    settings_ = server_settings(tmp_path / "home", parallel=2, ctx=512, generation_timeout=2.0)
    with running_server(settings_) as server:
        warm = httpx.post(
            server.url + "/api/generate",
            json={"model": "smollm2", "prompt": "hi", "stream": False, "options": {"num_predict": 1}},
            timeout=120,
        )
        assert warm.status_code == 200  # loaded once, at the server's own context size
        spec = httpx.get(server.url + "/openapi.json", timeout=30).json()
        sent = fuzz(
            server, spec, examples=4, modes=(GenerationMode.POSITIVE,), paths=GENERATION_ROUTES, tame=tame
        )
        assert sent >= len(GENERATION_ROUTES) * 2
