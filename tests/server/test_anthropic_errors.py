"""Bad input and refusals on /v1/messages, in Anthropic's error envelope and with its status codes."""

from __future__ import annotations

import re

import anthropic
import httpx
import pytest

HELLO = [{"role": "user", "content": "Say hello."}]
GOOD = {"model": "smollm2", "max_tokens": 16, "messages": HELLO}


@pytest.fixture
def server(scripted):
    with scripted(lambda prompt: "Hello.") as s:
        yield s


def post(server, body: object, path: str = "/v1/messages", **kwargs) -> httpx.Response:
    if isinstance(body, bytes):
        return httpx.post(server.url + path, content=body, headers={"content-type": "application/json"})
    return httpx.post(server.url + path, json=body, **kwargs)


def envelope(response: httpx.Response) -> tuple[int, str, str]:
    body = response.json()
    assert body["type"] == "error" and set(body["error"]) >= {"type", "message"}
    return response.status_code, body["error"]["type"], body["error"]["message"]


def test_the_good_request_is_answered(server):
    assert post(server, GOOD).json()["content"] == [{"type": "text", "text": "Hello."}]


def test_missing_max_tokens_is_a_400_naming_the_field(server):
    body = {"model": "smollm2", "messages": HELLO}
    status, kind, message = envelope(post(server, body))
    assert (status, kind) == (400, "invalid_request_error")
    assert "max_tokens" in message


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("messages", "hello"),
        ("max_tokens", "lots"),
        ("max_tokens", 0),
        ("temperature", "hot"),
        ("stop_sequences", "STOP"),
        ("system", 42),
        ("tool_choice", {"type": "sometimes"}),
    ],
)
def test_wrong_types_are_a_400_naming_the_field(server, field, value):
    status, kind, message = envelope(post(server, {**GOOD, field: value}))
    assert (status, kind) == (400, "invalid_request_error")
    assert field in message


def test_a_role_anthropic_does_not_have_is_a_400(server):
    body = {**GOOD, "messages": [{"role": "tool", "content": "hi"}]}
    status, kind, message = envelope(post(server, body))
    assert (status, kind) == (400, "invalid_request_error")
    assert "messages.0.role" in message


def test_a_system_message_cannot_open_the_conversation(server):
    body = {**GOOD, "messages": [{"role": "system", "content": "hi"}, *HELLO]}
    status, kind, message = envelope(post(server, body))
    assert (status, kind) == (400, "invalid_request_error")
    assert "messages.0.role" in message and "top-level `system`" in message


def test_no_messages_is_a_400_even_with_a_system_prompt(server):
    status, kind, message = envelope(post(server, {**GOOD, "system": "Be brief.", "messages": []}))
    assert (status, kind) == (400, "invalid_request_error")
    assert "messages" in message


@pytest.mark.parametrize(
    ("budget", "max_tokens", "fragment"),
    [
        (1023, 4096, "greater than or equal to 1024"),
        (2048, 2048, "`max_tokens` must be greater than `thinking.budget_tokens`"),
    ],
    ids=["below-1024", "not-below-max-tokens"],
)
def test_a_thinking_budget_anthropic_refuses_is_a_400(server, budget, max_tokens, fragment):
    thinking = {"type": "enabled", "budget_tokens": budget}
    body = {**GOOD, "max_tokens": max_tokens, "thinking": thinking}
    status, kind, message = envelope(post(server, body))
    assert (status, kind) == (400, "invalid_request_error")
    assert fragment in message


def test_every_error_carries_a_request_id_in_the_body_and_the_header(server):
    for response in (
        post(server, {**GOOD, "messages": []}),
        post(server, {**GOOD, "model": "no-such-model"}),
        post(server, GOOD, path="/v1/messages/batches"),
    ):
        body = response.json()
        assert re.fullmatch(r"req_[0-9a-f]{24}", body["request_id"]), body
        assert response.headers["request-id"] == body["request_id"]
    with pytest.raises(anthropic.BadRequestError) as refused:
        api = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
        api.messages.create(model="smollm2", max_tokens=16, messages=[])
    assert refused.value.request_id == refused.value.body["request_id"]


def test_malformed_json_is_a_400(server):
    status, kind, message = envelope(post(server, b'{"model": "smollm2", "max_tokens": 16,'))
    assert (status, kind) == (400, "invalid_request_error")
    assert "not valid JSON" in message


def test_an_unknown_model_is_a_404_not_found_error(server):
    status, kind, message = envelope(post(server, {**GOOD, "model": "claude-opus-4-1"}))
    assert (status, kind) == (404, "not_found_error")
    assert "claude-opus-4-1" in message
    with pytest.raises(anthropic.NotFoundError):
        anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0).messages.create(
            model="claude-opus-4-1", max_tokens=8, messages=HELLO
        )


def test_an_image_block_is_a_clear_400_for_a_text_only_model(server):
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    body = {
        **GOOD,
        "messages": [{"role": "user", "content": [image, {"type": "text", "text": "What is it?"}]}],
    }
    status, kind, message = envelope(post(server, body))
    assert (status, kind) == (400, "invalid_request_error")
    assert "'image'" in message and "text-only" in message


def test_an_image_inside_a_tool_result_is_refused_too(server):
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    messages = [
        {"role": "user", "content": "Take a screenshot."},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "shot", "input": {}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [image]}]},
    ]
    status, kind, message = envelope(post(server, {**GOOD, "messages": messages}))
    assert (status, kind) == (400, "invalid_request_error")
    assert "messages.2.content.0" in message and "text-only" in message


def test_an_unknown_route_under_messages_is_a_404_in_anthropics_envelope(server):
    status, kind, _ = envelope(post(server, GOOD, path="/v1/messages/batches"))
    assert (status, kind) == (404, "not_found_error")


def test_a_prompt_longer_than_the_context_is_a_400_in_anthropics_words(scripted):
    """Claude Code and the SDKs read "prompt is too long: N tokens > M maximum" (a 413 reads as a body
    too large); the sentence after it says what sets the limit."""
    with scripted(lambda prompt: "Hello.", engine={"ctx": 256}) as s:
        body = {**GOOD, "messages": [{"role": "user", "content": "word " * 100}]}
        status, kind, message = envelope(post(s, body))
    assert (status, kind) == (400, "invalid_request_error")
    assert re.match(r"prompt is too long: (\d+) tokens > 255 maximum \(a row of scripted holds 256", message)
    assert int(message.split()[4]) > 255


def test_a_full_queue_is_a_529_overloaded_error_the_sdk_knows(scripted):
    with scripted(lambda prompt: "Hello.", max_queue=0) as s:
        response = post(s, GOOD)
        status, kind, _ = envelope(response)
        assert (status, kind) == (529, "overloaded_error")
        assert int(response.headers["retry-after"]) >= 1
        with pytest.raises(anthropic.OverloadedError):
            anthropic.Anthropic(base_url=s.url, api_key="x", max_retries=0).messages.create(**GOOD)


def test_with_an_api_key_set_the_sdks_x_api_key_is_accepted_and_a_wrong_one_is_401(scripted):
    with scripted(lambda prompt: "Hello.", api_key="sk-secret") as s:
        reply = anthropic.Anthropic(base_url=s.url, api_key="sk-secret", max_retries=0).messages.create(
            **GOOD
        )
        assert reply.content[0].text == "Hello."
        bearer = post(s, GOOD, headers={"authorization": "Bearer sk-secret"})
        assert bearer.status_code == 200
        status, kind, _ = envelope(post(s, GOOD, headers={"x-api-key": "sk-wrong"}))
        assert (status, kind) == (401, "authentication_error")
        with pytest.raises(anthropic.AuthenticationError):
            anthropic.Anthropic(base_url=s.url, api_key="sk-wrong", max_retries=0).messages.create(**GOOD)
