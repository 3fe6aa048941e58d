"""Web pages the user opens while kinfer runs on 127.0.0.1: they can send requests, so they must not
be able to use the server (Ollama's CVE-2024-28224 was DNS rebinding of exactly this kind).

A page reaches us two ways. DNS rebinding: the page's own name (`rebind.evil.example`) is made to
resolve to 127.0.0.1, so its requests carry `Host: rebind.evil.example` and count as same-origin for
the browser. A "simple" cross-site request: `fetch` with `Content-Type: text/plain` needs no
preflight, so it is sent (with `Origin: https://evil.example`) even though the page never reads the
answer. Each must be refused before anything happens: no alias made, no model pulled, no prompt run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from kinfer.server.access import HostPolicy, OriginPolicy
from tests.fixtures.hub_server import FakeRepo, HubServer
from tests.fixtures.tiny_gguf import write_tiny_gguf
from tests.hardening.routes import ROUTES, error_message
from tests.live_server import LiveServer, running_server, server_settings
from tests.scripted_engine import ScriptedEngine

EVIL_HOST = "rebind.evil.example"
EVIL_ORIGIN = "https://evil.example"
TIMEOUT = httpx.Timeout(60.0)


@dataclass
class Target:
    server: LiveServer
    hub: HubServer
    prompts: list[str]

    @property
    def url(self) -> str:
        return self.server.url

    def names(self) -> list[str]:
        return [m["name"] for m in httpx.get(self.url + "/api/tags", timeout=TIMEOUT).json()["models"]]


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    """A server with no key (the default), a scripted model, and a hub holding a repo a page could pull."""
    root = tmp_path_factory.mktemp("pages")
    home = root / "home"
    (home / "models").mkdir(parents=True)
    write_tiny_gguf(home / "models" / "tiny.gguf")
    prompts: list[str] = []

    def factory(model, settings, ctx):
        return ScriptedEngine(reply=lambda prompt: prompts.append(prompt) or "hello")

    mp = pytest.MonkeyPatch()
    mp.setenv("OLLAMA_MODELS", str(root / "no-ollama"))
    gguf = write_tiny_gguf(root / "src" / "m.gguf")[0].read_bytes()
    with HubServer({"evil/Planted-GGUF": FakeRepo({"m-Q4_K_M.gguf": gguf})}) as hub:
        hub.patch_env(mp, token_dir=str(root))
        with running_server(server_settings(home), engine_factory=factory) as server:
            yield Target(server, hub, prompts)
    mp.undo()


def attacks(model: str = "tiny") -> list[tuple[str, str, dict]]:
    """What a page would do: list, alias, pull, chat in every dialect."""
    chats = [("POST", r.path, r.body(model=model)) for r in ROUTES]
    return [
        ("GET", "/api/tags", {}),
        ("POST", "/api/copy", {"source": model, "destination": "planted-alias"}),
        ("POST", "/api/pull", {"model": "evil/Planted-GGUF", "stream": False}),
        *chats,
    ]


def send(target: Target, method: str, path: str, body: dict, headers: dict[str, str]) -> httpx.Response:
    content = json.dumps(body).encode() if body else None
    return httpx.request(method, target.url + path, content=content, headers=headers, timeout=TIMEOUT)


def assert_nothing_happened(target: Target) -> None:
    assert "planted-alias" not in target.names()
    assert not any(n.startswith("hf.co/evil/") for n in target.names())
    assert target.hub.requests == [], "the hub was asked for something"
    assert target.prompts == [], "a prompt reached the model"


# ---- DNS rebinding: the Host header -------------------------------------------------------------


@pytest.mark.parametrize(("method", "path", "body"), attacks(), ids=lambda v: v if isinstance(v, str) else "")
def test_a_rebound_host_name_is_refused_in_the_callers_dialect(target: Target, method, path, body):
    reply = send(
        target,
        method,
        path,
        body,
        {"Host": f"{EVIL_HOST}:{target.server.port}", "Content-Type": "application/json"},
    )
    assert reply.status_code == 403, reply.text[:300]
    assert "--allowed-hosts" in error_message(path, reply)
    assert_nothing_happened(target)


@pytest.mark.parametrize(
    "host", ["localhost", "127.0.0.1", "[::1]", "LOCALHOST", "app.localhost", "127.0.0.2"]
)
def test_loopback_host_names_are_answered_with_or_without_the_port(target: Target, host: str):
    for value in (host, f"{host}:{target.server.port}"):
        reply = httpx.get(target.url + "/api/tags", headers={"Host": value}, timeout=TIMEOUT)
        assert reply.status_code == 200, (value, reply.text[:200])


def test_allowed_hosts_adds_names_and_star_admits_any(tmp_path: Path):
    settings = server_settings(tmp_path, allowed_hosts="kinfer.lan, *.corp.example")
    with running_server(settings) as server:

        def status(host: str) -> int:
            return httpx.get(server.url + "/v1/models", headers={"Host": host}, timeout=TIMEOUT).status_code

        assert status("kinfer.lan:11500") == 200
        assert status("gpu.corp.example") == 200
        assert status("localhost") == 200
        assert status("corp.example.evil.example") == 403
        assert status(EVIL_HOST) == 403
    with running_server(server_settings(tmp_path, allowed_hosts="*")) as server:
        assert httpx.get(server.url + "/v1/models", headers={"Host": EVIL_HOST}).status_code == 200


def test_host_policy_by_bind_address():
    loopback = HostPolicy("", "127.0.0.1")
    assert loopback.allows("localhost:11500") and loopback.allows("[::1]:1") and loopback.allows(None)
    assert not loopback.allows("192.168.1.5:11500") and not loopback.allows(f"{EVIL_HOST}:11500")
    # bound to every interface on purpose: clients use names we cannot know, so all are answered
    # (as Ollama does); --allowed-hosts narrows it to loopback, IP literals and the names listed
    exposed = HostPolicy("", "0.0.0.0")
    assert exposed.allows(EVIL_HOST) and exposed.allows("my-box.lan")
    narrowed = HostPolicy("my-box.lan", "0.0.0.0")
    assert narrowed.allows("my-box.lan:11500") and narrowed.allows("192.168.1.5:11500")
    assert narrowed.allows("[fe80::1]:11500") and narrowed.allows("localhost")
    assert not narrowed.allows(EVIL_HOST)


# ---- cross-site requests: the Origin header and the content type ----------------------------------


@pytest.mark.parametrize(("method", "path", "body"), attacks(), ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "application/json"]
)
def test_a_request_from_a_foreign_page_is_refused(target: Target, method, path, body, content_type):
    reply = send(target, method, path, body, {"Origin": EVIL_ORIGIN, "Content-Type": content_type})
    assert reply.status_code == 403, reply.text[:300]
    assert "--origins" in error_message(path, reply)
    assert "access-control-allow-origin" not in reply.headers
    assert_nothing_happened(target)


def test_an_opaque_origin_and_a_foreign_preflight_are_refused(target: Target):
    # a sandboxed iframe or a file:// page says `Origin: null`
    null = send(
        target, "POST", "/api/copy", attacks()[1][2], {"Origin": "null", "Content-Type": "text/plain"}
    )
    assert null.status_code == 403
    preflight = httpx.options(
        target.url + "/api/copy",
        headers={"Origin": EVIL_ORIGIN, "Access-Control-Request-Method": "POST"},
        timeout=TIMEOUT,
    )
    assert preflight.status_code == 403
    assert "access-control-allow-origin" not in preflight.headers
    assert_nothing_happened(target)


def test_an_allowed_page_must_send_json_as_json(target: Target):
    page = {"Origin": "http://localhost:3000"}
    body = ROUTES[0].body(model="tiny", max_tokens=2)
    plain = send(target, "POST", "/v1/chat/completions", body, {**page, "Content-Type": "text/plain"})
    assert plain.status_code == 415, plain.text
    assert "application/json" in error_message("/v1/chat/completions", plain)
    assert target.prompts == []
    json_reply = send(
        target, "POST", "/v1/chat/completions", body, {**page, "Content-Type": "application/json"}
    )
    assert json_reply.status_code == 200, json_reply.text
    assert json_reply.headers["access-control-allow-origin"] == "http://localhost:3000"
    target.prompts.clear()


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "application/x-www-form-urlencoded",
        "text/plain; charset=utf-8",
        "application/json; charset=utf-8",
    ],
)
def test_clients_that_are_not_browsers_may_send_json_under_any_content_type(target: Target, content_type):
    # `curl -d '{...}'` says application/x-www-form-urlencoded (Ollama's README does this); aiohttp
    # says text/plain for a str body. No Origin: not a page. The body must still be JSON.
    headers = {"Content-Type": content_type} if content_type else {}
    body = {"model": "tiny", "prompt": "hi", "stream": False, "options": {"num_predict": 2}}
    reply = send(target, "POST", "/api/generate", body, headers)
    assert reply.status_code == 200, reply.text
    target.prompts.clear()
    form = httpx.post(target.url + "/api/generate", data={"model": "tiny", "prompt": "hi"}, timeout=TIMEOUT)
    assert form.status_code == 400 and "not valid JSON" in form.json()["error"]


def test_origin_policy():
    policy = OriginPolicy("https://app.example.com:8443,chrome-extension://abcdef")
    assert policy.allows("http://localhost:5173") and policy.allows("http://127.0.0.1")
    assert policy.allows("https://[::1]:8080") and policy.allows("http://app.localhost:3000")
    assert policy.allows("https://app.example.com:8443") and policy.allows("chrome-extension://abcdef")
    assert not policy.allows("https://app.example.com:9999") and not policy.allows("null")
    assert not policy.allows(EVIL_ORIGIN) and not policy.allows("http://localhost.evil.example")
    assert not policy.allows("http://localhost:99999999") and not policy.allows("file://")
    assert OriginPolicy("*").allows(EVIL_ORIGIN)


# ---- what the health check tells a stranger ---------------------------------------------------------


def test_health_without_the_key_says_only_that_the_server_is_up(tmp_path: Path):
    def factory(model, settings, ctx):
        return ScriptedEngine(reply=lambda prompt: "hello")

    with running_server(server_settings(tmp_path, api_key="k3y"), engine_factory=factory) as server:
        server.call(server.runtime.scheduler.load("smollm2"))
        stranger = httpx.get(server.url + "/health", timeout=TIMEOUT)
        assert stranger.status_code == 200
        assert stranger.json() == {"status": "ok"}
        holder = httpx.get(server.url + "/health", headers={"Authorization": "Bearer k3y"}, timeout=TIMEOUT)
        assert holder.json()["loaded"] == ["smollm2:135m"] and "version" in holder.json()
    with running_server(server_settings(tmp_path)) as server:  # no key set: everyone is the key holder
        assert set(httpx.get(server.url + "/health", timeout=TIMEOUT).json()) == {
            "status",
            "version",
            "loaded",
        }
