"""Hostile input against the real server on 127.0.0.1, in every dialect: a clean 4xx, never a 500 or a hang.

The server runs the bundled SmolLM2 with a 2 s generation deadline, so a request that is (rightly)
accepted with an absurd token budget still ends quickly. Every client call has a timeout: a hang
fails the test instead of stalling the suite.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.fixtures.hub_server import HubServer
from tests.hardening.gguf_template import copy_with_template
from tests.hardening.routes import (
    JSON_ROUTES,
    ROUTE_IDS,
    ROUTES,
    Route,
    assert_handled,
    assert_refused,
)
from tests.live_server import LiveServer, running_server, server_settings

TIMEOUT = httpx.Timeout(60.0)
TEN_MB = 10 * 1024 * 1024


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> LiveServer:
    home = tmp_path_factory.mktemp("hostile") / "home"
    home.mkdir()
    mp = pytest.MonkeyPatch()
    mp.setenv("OLLAMA_MODELS", str(home / "no-ollama"))
    settings = server_settings(home, parallel=2, ctx=512, generation_timeout=2.0)
    # an empty hub of our own: a pull is answered "no such repo", never "offline" or the real Hub
    with HubServer() as hub, running_server(settings) as live:
        hub.patch_env(mp, token_dir=str(home.parent))
        yield live
    mp.undo()


@pytest.fixture(scope="module")
def client(server: LiveServer) -> httpx.Client:
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as c:
        yield c


def post_raw(client: httpx.Client, method: str, path: str, raw: bytes) -> httpx.Response:
    return client.request(method, path, content=raw, headers={"content-type": "application/json"})


# ---- bodies that are not a request at all: 400 everywhere, in the dialect's envelope ----------------

DEEP = 100_000
MALFORMED = {
    "truncated": b'{"model": "smollm2", "messages": [{"role": "user", "con',
    "not-json": b"model=smollm2&prompt=hi",
    "empty": b"",
    "whitespace": b"  \n ",
    "array": b'[{"model": "smollm2"}]',
    "string": b'"hello"',
    "invalid-utf8": b'{"model": "smollm2", "prompt": "\xff\xfe\xc3(", "messages": []}',
    "lone-surrogate": b'{"model": "smollm2", "messages": [{"role": "user", "content": "a\\ud800b"}],'
    b' "prompt": "a\\udfffb", "input": "\\ud800", "max_tokens": 2, "stream": false,'
    b' "source": "smollm2", "destination": "x\\ud800"}',
    "nan": b'{"model": "smollm2", "max_tokens": NaN, "temperature": NaN, "options": {"temperature": NaN}}',
    "infinity": b'{"model": "smollm2", "temperature": Infinity, "options": {"temperature": -Infinity}}',
    "deep-arrays": b'{"model": "smollm2", "messages": ' + b"[" * DEEP + b"]" * DEEP + b"}",
    "deep-objects": b'{"a": ' * DEEP + b"1" + b"}" * DEEP,
    "5000-digit-integer": b'{"model": "smollm2", "max_tokens": ' + b"9" * 5000 + b"}",
    "nul-outside-strings": b'{"model": "smollm2",\x00 "prompt": "hi"}',
}


@pytest.mark.parametrize(("method", "path"), JSON_ROUTES, ids=[p for _, p in JSON_ROUTES])
@pytest.mark.parametrize("raw", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_body_that_is_not_a_request_is_a_400(client: httpx.Client, method: str, path: str, raw: bytes):
    reply = post_raw(client, method, path, raw)
    message = assert_refused(path, reply, 400)
    assert "internal" not in message


# ---- deeply nested tool schemas and arguments: 400 where they come in, never a RecursionError (500) --


def nested_schema(levels: int) -> str:
    """A JSON schema `levels` objects deep (two JSON levels each), as text: json.dumps would recurse."""
    return '{"type": "object", "properties": {"x": ' * levels + '{"type": "string"}' + "}}" * levels


def tools_json(path: str, schema: str) -> str:
    if path.startswith("/v1/messages"):
        return f'[{{"name": "f", "description": "d", "input_schema": {schema}}}]'
    if path == "/v1/responses":
        return f'[{{"type": "function", "name": "f", "parameters": {schema}}}]'
    return f'[{{"type": "function", "function": {{"name": "f", "parameters": {schema}}}}}]'


TOOL_ROUTES = [r for r in ROUTES if r.path not in ("/v1/completions", "/api/generate")]


@pytest.mark.parametrize("route", TOOL_ROUTES, ids=lambda r: r.name)
def test_a_tool_schema_nested_900_levels_is_a_400(client: httpx.Client, route: Route):
    # 450 schema levels (900 JSON levels) used to parse, then fail rendering: a 500
    raw = json.dumps(route.body(tools="TOOLS")).replace('"TOOLS"', tools_json(route.path, nested_schema(450)))
    message = assert_refused(route.path, post_raw(client, "POST", route.path, raw.encode()), 400)
    assert "nested more than 100 levels deep" in message


@pytest.mark.parametrize("route", TOOL_ROUTES, ids=lambda r: r.name)
def test_a_tool_schema_just_inside_the_depth_limit_is_served(client: httpx.Client, route: Route):
    # an array of arrays 90 deep: with the body's own levels, about 95 of the 100 allowed (and short
    # enough for SmolLM2's 512-token rows once kinfer's default tool prompt lists it)
    schema = '{"items": ' * 90 + "{}" + "}" * 90
    raw = json.dumps(route.body(tools="TOOLS")).replace('"TOOLS"', tools_json(route.path, schema))
    reply = post_raw(client, "POST", route.path, raw.encode())
    assert reply.status_code == 200, reply.text[:300]


@pytest.mark.parametrize(
    ("path", "messages"),
    [
        (
            "/v1/chat/completions",
            '[{"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",'
            ' "function": {"name": "f", "arguments": ARGS}}]},'
            ' {"role": "tool", "tool_call_id": "c1", "content": "ok"}]',
        ),
        (
            "/v1/responses",
            '[{"type": "function_call", "call_id": "c1", "name": "f", "arguments": ARGS},'
            ' {"type": "function_call_output", "call_id": "c1", "output": "ok"}]',
        ),
    ],
    ids=["openai-chat", "responses"],
)
def test_tool_call_arguments_nested_in_a_json_string_are_a_400(
    client: httpx.Client, path: str, messages: str
):
    # OpenAI's dialects send arguments as a JSON string: the body's own depth check cannot see inside
    arguments = json.dumps("[" * 5000 + "]" * 5000)
    field = "input" if path == "/v1/responses" else "messages"
    raw = f'{{"model": "smollm2", "max_tokens": 2, "{field}": {messages.replace("ARGS", arguments)}}}'
    message = assert_refused(path, post_raw(client, "POST", path, raw.encode()), 400)
    assert "nested more than 100 levels deep" in message


@pytest.mark.parametrize("route", ROUTES, ids=ROUTE_IDS)
def test_wrong_types_are_named_in_the_400(client: httpx.Client, route: Route):
    body = route.body(content=12345, model=["smollm2"])
    body["stream"] = "sometimes"
    message = assert_refused(route.path, client.post(route.path, json=body), 400)
    assert "model" in message


# ---- absurd numbers: refused, or accepted and bounded by the row and the deadline -----------------

HUGE = {
    "max-tokens-1e30": {"max_tokens": 1e30},
    "max-tokens-2**80": {"max_tokens": 2**80},
    "max-tokens-negative": {"max_tokens": -(2**63)},
    "temperature-1e308": {"temperature": 1e308},
    "seed-2**80": {"seed": 2**80},
    "top-k-2**70": {"top_k": 2**70},
}


@pytest.mark.parametrize("route", ROUTES, ids=ROUTE_IDS)
@pytest.mark.parametrize("fields", HUGE.values(), ids=HUGE.keys())
def test_absurd_numbers_are_refused_or_bounded(client: httpx.Client, route: Route, fields: dict):
    reply = client.post(route.path, json=route.body(**fields))
    assert_handled(route, reply)


def test_an_absurd_budget_that_is_accepted_ends_at_the_row_or_the_deadline(client: httpx.Client):
    reply = client.post("/v1/chat/completions", json=ROUTES[0].body(max_tokens=2**80))
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    assert choice["finish_reason"] in ("stop", "length")
    assert reply.json()["usage"]["completion_tokens"] < 512


# ---- big and odd strings ---------------------------------------------------------------------------


@pytest.mark.parametrize("route", ROUTES, ids=ROUTE_IDS)
def test_a_10_mb_prompt_is_a_400_without_holding_the_engine(client: httpx.Client, route: Route):
    """Too long for the context (not for the body limit): a 400 in every dialect, Ollama included (its
    truncation drops old turns, and a lone turn this long cannot fit)."""
    reply = client.post(route.path, json=route.body(content="hello world " * (TEN_MB // 12)))
    message = assert_refused(route.path, reply, 400)
    assert "tokens" in message


@pytest.mark.parametrize("route", ROUTES, ids=ROUTE_IDS)
def test_a_10_mb_model_name_is_not_found(client: httpx.Client, route: Route):
    reply = client.post(route.path, json=route.body(model="m" * TEN_MB))
    assert_refused(route.path, reply, 404)
    assert len(reply.content) < 4096  # the name is not repeated back


# ---- names that would be stored: a length and an alphabet ------------------------------------------

TWENTY_MILLION = 20_000_000


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/api/copy", {"source": "smollm2", "destination": "a" * TWENTY_MILLION}),
        ("POST", "/api/copy", {"source": "smollm2", "destination": "a" * 257}),
        ("POST", "/api/pull", {"model": "o/" + "r" * TWENTY_MILLION, "stream": True}),
        ("POST", "/api/pull", {"model": "o/repo:" + "q" * 10_000, "stream": False}),
        ("POST", "/api/pull", {"model": "o/" + "r" * 97, "stream": False}),
        ("POST", "/api/show", {"model": "s" * TWENTY_MILLION}),
        ("DELETE", "/api/delete", {"model": "s" * TWENTY_MILLION}),
    ],
    ids=["copy-20M", "copy-257", "pull-20M", "pull-long-tag", "pull-long-repo", "show-20M", "delete-20M"],
)
def test_an_overlong_name_is_refused_briefly_and_nothing_is_stored(client: httpx.Client, method, path, body):
    reply = client.request(method, path, json=body)
    assert_refused(path, reply)
    assert len(reply.content) < 4096  # the name is not repeated back
    assert [m["name"] for m in client.get("/api/tags").json()["models"]] == ["smollm2:135m"]


@pytest.mark.parametrize(
    "alias", ["my model", "a;b", "caf\u00e9", "x:y:z", "-x", "a/", "tab\tname", "<script>"]
)
def test_an_alias_is_letters_digits_dot_dash_underscore(client: httpx.Client, alias: str):
    reply = client.post("/api/copy", json={"source": "smollm2", "destination": alias})
    assert "refusing to create the alias" in assert_refused("/api/copy", reply, 400)
    good = client.post("/api/copy", json={"source": "smollm2", "destination": "Team_A/smol-2.1:v1"})
    assert good.status_code == 200, good.text
    assert client.request("DELETE", "/api/delete", json={"model": "team_a/smol-2.1:v1"}).status_code == 200


def test_a_body_over_the_limit_is_a_413_in_every_dialect(tmp_path: Path):
    with running_server(server_settings(tmp_path, max_body_mb=1)) as small:
        for route in ROUTES:
            reply = httpx.post(
                small.url + route.path, json=route.body(content="x" * (2 * 1024 * 1024)), timeout=TIMEOUT
            )
            assert_refused(route.path, reply, 413)


@pytest.mark.parametrize("route", ROUTES, ids=ROUTE_IDS)
def test_nul_bytes_in_the_text_are_just_text(client: httpx.Client, route: Route):
    assert_handled(route, client.post(route.path, json=route.body(content="a\x00b\x00\x00c")))


@pytest.mark.parametrize("route", ROUTES, ids=ROUTE_IDS)
def test_nul_bytes_in_a_model_name_find_no_model(client: httpx.Client, route: Route):
    assert_refused(route.path, client.post(route.path, json=route.body(model="smollm2\x00../../etc")), 404)


def test_a_10_mb_stop_string_is_handled(client: httpx.Client):
    reply = client.post("/v1/chat/completions", json=ROUTES[0].body(stop=["s" * TEN_MB]))
    assert reply.status_code == 200, reply.text[:300]


# ---- path traversal in model names ------------------------------------------------------------------

TRAVERSALS = [
    "../../etc/passwd",
    "/etc/passwd",
    "..",
    "models/../../canary.gguf",
    "~/.ssh/id_rsa",
    "..\\..\\windows",
    "C:\\Windows\\win.ini",
]


@pytest.fixture(scope="module")
def canary(server: LiveServer) -> Path:
    """A file beside the store that looks like a model: nothing may read, copy or delete it."""
    path = server.runtime.settings.home.parent / "canary.gguf"
    path.write_bytes(b"GGUF canary, not a model")
    return path


@pytest.mark.parametrize("name", [*TRAVERSALS, "CANARY"])
def test_path_like_model_names_never_reach_the_filesystem(client: httpx.Client, canary: Path, name: str):
    name = str(canary) if name == "CANARY" else name
    calls = [
        ("POST", "/api/show", {"model": name}),
        ("DELETE", "/api/delete", {"model": name}),
        ("POST", "/api/copy", {"source": name, "destination": "stolen"}),
        ("POST", "/api/copy", {"source": "smollm2", "destination": name}),
        ("POST", "/api/pull", {"model": name, "stream": True}),
        ("POST", "/api/pull", {"model": name, "stream": False}),
        ("POST", "/api/chat", {"model": name, "messages": [{"role": "user", "content": "hi"}]}),
        ("POST", "/v1/chat/completions", {"model": name, "messages": [{"role": "user", "content": "hi"}]}),
    ]
    for method, path, body in calls:
        reply = client.request(method, path, json=body)
        if path == "/api/pull" and body["stream"] and reply.status_code == 200:
            # a well-formed reference asks the hub, and a streamed pull reports failure in-stream (as
            # Ollama does): "/etc/passwd" reads as the repo etc/passwd, which our hub has not
            assert "error" in json.loads(reply.text.splitlines()[-1]), reply.text
            continue
        assert_refused(path, reply)
    assert canary.read_bytes() == b"GGUF canary, not a model"
    names = [m["name"] for m in client.get("/api/tags").json()["models"]]
    assert "stolen" not in names and names == ["smollm2:135m"]


@pytest.mark.parametrize(
    "raw_path",
    [
        "/v1/models/..%2F..%2Fetc%2Fpasswd",
        "/v1/models/%2e%2e%2f%2e%2e%2fetc%2fpasswd",
        "/v1/models/..%5C..%5Cetc%5Cpasswd",
        "/v1/models/%00",
        "/v1/models/%ff%fe",
    ],
)
def test_traversal_in_the_model_url_is_a_404(server: LiveServer, raw_path: str):
    # httpx would normalise `../` away; send the path exactly as written
    with httpx.Client(timeout=TIMEOUT) as raw:
        request = raw.build_request("GET", server.url)
        request.url = request.url.copy_with(raw_path=raw_path.encode())
        reply = raw.send(request)
    message = assert_refused(raw_path, reply, 404)
    assert "root:" not in reply.text and "not found" in message


def test_dot_segments_in_the_url_are_a_404(server: LiveServer):
    with httpx.Client(timeout=TIMEOUT) as raw:
        request = raw.build_request("GET", server.url)
        request.url = request.url.copy_with(raw_path=b"/v1/models/../../etc/passwd")
        reply = raw.send(request)
    assert reply.status_code == 404
    assert "root:" not in reply.text


# ---- chat templates that try to leave the Jinja sandbox --------------------------------------------

ATTACKS = {
    "mro-subclasses": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "cycler-popen": "{{ cycler.__init__.__globals__.os.popen('touch CANARY').read() }}",
    "lipsum-globals": "{{ lipsum.__globals__['os'].popen('touch CANARY').read() }}",
    "joiner-globals": "{{ joiner.__init__.__globals__['os'].system('touch CANARY') }}",
    "self-init-globals": "{{ self.__init__.__globals__['__builtins__']['open']('SECRET').read() }}",
    "self-init": "{{ self.__init__ }}",
    "include-file": "{% include 'SECRET' %}",
    "import-os": "{% import 'os' as os %}{{ os.system('touch CANARY') }}",
    "attr-filter": "{{ ''|attr('__class__')|attr('__mro__') }}",
    "format-string": "{{ '{0.__class__.__init__.__globals__}'.format(cycler) }}",
    # not escapes but allocations: each built 143 MiB before the size guards (jinja_limits)
    "percent-width": "{{ '%150000000d' % 1 }}",
    "center-width": "{{ ''|center(300000000) }}",
    "format-width": "{{ '{:>450000000}'.format(1) }}",
}


def evil_template(canary: Path, secret: Path) -> str:
    """One template, many attacks: the user's message picks which one runs."""
    branches = []
    for i, (name, attack) in enumerate(ATTACKS.items()):
        body = attack.replace("CANARY", str(canary)).replace("SECRET", str(secret))
        branches.append(f"{'if' if i == 0 else 'elif'} messages[-1]['content'] == '{name}' %}}{body}{{%")
    benign = "<|im_start|>user\n{{ messages[-1]['content'] }}<|im_end|>\n<|im_start|>assistant\n"
    return "{% " + " ".join(branches) + f" else %}}{benign}{{% endif %}}"


@pytest.fixture(scope="module")
def evil(tmp_path_factory: pytest.TempPathFactory, smollm2_gguf: Path):
    """A server whose store holds SmolLM2 under the evil template, plus the canary and the secret."""
    root = tmp_path_factory.mktemp("evil")
    home = root / "home"
    (home / "models").mkdir(parents=True)
    canary, secret = root / "pwned", root / "secret.txt"
    secret.write_text("TOP-SECRET " * 200)
    copy_with_template(smollm2_gguf, home / "models" / "evil.gguf", evil_template(canary, secret))
    mp = pytest.MonkeyPatch()
    mp.setenv("OLLAMA_MODELS", str(root / "no-ollama"))
    with running_server(server_settings(home, parallel=1, ctx=512, generation_timeout=2.0)) as live:
        yield live, canary
    mp.undo()


def test_the_evil_model_serves_an_honest_request(evil):
    live, _ = evil
    reply = httpx.post(
        live.url + "/v1/chat/completions",
        json=ROUTES[0].body(content="Say hi.", model="evil"),
        timeout=TIMEOUT,
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["prompt_tokens"] < 20


@pytest.mark.parametrize(
    "route",
    [
        r
        for r in ROUTES
        if r.path in ("/v1/chat/completions", "/v1/messages", "/api/chat", "/v1/messages/count_tokens")
    ],
    ids=lambda r: r.name,
)
@pytest.mark.parametrize("attack", ATTACKS)
def test_a_template_escape_is_refused_or_harmless(evil, route: Route, attack: str):
    live, canary = evil
    reply = httpx.post(live.url + route.path, json=route.body(content=attack, model="evil"), timeout=TIMEOUT)
    assert not canary.exists(), f"{attack} ran a command"
    if reply.status_code == 200:
        # rendered harmlessly: the unsafe read printed nothing, so the prompt stayed tiny
        body = reply.json()
        prompt_tokens = (
            body.get("input_tokens")
            or body.get("usage", {}).get("prompt_tokens")
            or body.get("usage", {}).get("input_tokens")
            or body.get("prompt_eval_count", 0)
        )
        assert prompt_tokens < 20, (attack, body)
        assert "TOP-SECRET" not in json.dumps(body)
    else:
        message = assert_refused(route.path, reply, 400)
        # refused by the sandbox, or rendered to nothing (an unsafe read prints as empty)
        assert "chat template" in message or "prompt is empty" in message, message
        assert "TOP-SECRET" not in message
    if attack.endswith("-width"):
        assert reply.status_code == 400 and "is not allowed to build" in reply.text, reply.text


def test_an_empty_prompt_is_a_400_not_an_engine_failure(client: httpx.Client):
    completion = client.post("/v1/completions", json={"model": "smollm2", "prompt": "", "max_tokens": 2})
    assert "empty" in assert_refused("/v1/completions", completion, 400)
    raw = client.post("/api/generate", json={"model": "smollm2", "prompt": "", "raw": True, "stream": False})
    assert "empty" in assert_refused("/api/generate", raw, 400)


def test_an_endless_keep_alive_is_shown_as_the_end_of_time(client: httpx.Client):
    loaded = client.post("/api/generate", json={"model": "smollm2", "keep_alive": 1e300})
    assert loaded.status_code == 200, loaded.text
    ps = client.get("/api/ps")
    assert ps.status_code == 200, ps.text
    assert ps.json()["models"][0]["expires_at"].startswith("9999-12-31")
    client.post("/api/generate", json={"model": "smollm2", "keep_alive": -1})


def test_a_keep_alive_too_large_for_a_float_is_a_400(client: httpx.Client):
    raw = b'{"model": "smollm2", "keep_alive": 1' + b"0" * 400 + b"}"
    message = assert_refused("/api/generate", post_raw(client, "POST", "/api/generate", raw), 400)
    assert "keep_alive" in message
