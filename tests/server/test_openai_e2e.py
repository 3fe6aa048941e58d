"""OpenAI Chat Completions, Completions and Models against the real server, with the official SDK."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.live_server import LiveServer

FRANCE = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


@pytest.fixture(scope="module")
def client(smol_server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=smol_server.url + "/v1", api_key="unused", max_retries=0)


def test_models_lists_the_store(client: openai.OpenAI):
    ids = [m.id for m in client.models.list().data]
    assert ids == ["smollm2:135m"]


def test_a_chat_completion_answers_with_usage(client: openai.OpenAI):
    reply = client.chat.completions.create(model="smollm2", messages=FRANCE, temperature=0, max_tokens=32)
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert "Paris" in choice.message.content
    assert choice.finish_reason == "stop"
    assert reply.id.startswith("chatcmpl-")
    assert reply.model == "smollm2:135m"
    assert reply.usage.prompt_tokens == 42  # SmolLM2's template adds its default system line
    # "The capital of France is Paris." is 7 tokens; the end-of-turn token is generated too
    assert reply.usage.completion_tokens == 8
    assert reply.usage.total_tokens == 50


def test_streaming_gives_the_same_text_and_usage_at_the_end(client: openai.OpenAI):
    whole = client.chat.completions.create(model="smollm2", messages=FRANCE, temperature=0, max_tokens=32)
    chunks = list(
        client.chat.completions.create(
            model="smollm2",
            messages=FRANCE,
            temperature=0,
            max_tokens=32,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8
    assert chunks[0].choices[0].delta.role == "assistant"


def test_max_tokens_cuts_with_finish_reason_length(client: openai.OpenAI):
    reply = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Tell me a long story."}],
        temperature=0,
        max_completion_tokens=5,
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 5


def test_content_parts_and_stop_strings(client: openai.OpenAI):
    parts = [
        {"type": "text", "text": "What is the capital of France? "},
        {"type": "text", "text": "One sentence."},
    ]
    reply = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": parts}],
        temperature=0,
        max_tokens=32,
        stop=["France"],
    )
    assert "France" not in reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop"


def test_a_legacy_completion_continues_raw_text(client: openai.OpenAI):
    reply = client.completions.create(
        model="smollm2", prompt="The capital of France is", max_tokens=4, temperature=0
    )
    assert reply.choices[0].text.strip()
    assert reply.usage.prompt_tokens == 5
    assert reply.choices[0].finish_reason in ("length", "stop")


def test_a_seeded_sample_is_reproducible(client: openai.OpenAI):
    def sample() -> str:
        return (
            client.chat.completions.create(
                model="smollm2",
                messages=[{"role": "user", "content": "Name a colour."}],
                temperature=1.0,
                seed=7,
                max_tokens=12,
            )
            .choices[0]
            .message.content
        )

    assert sample() == sample()


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"model": "smollm2", "messages": []}, "messages"),
        ({"model": "smollm2", "messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
        ({"model": "smollm2", "messages": FRANCE, "n": 17}, "n:"),
        ({"model": "smollm2", "messages": FRANCE, "n": 0}, "n:"),
        ({"model": "smollm2", "messages": [{"role": "wizard", "content": "hi"}]}, "role"),
        ({"model": "smollm2", "messages": FRANCE, "temperature": "hot"}, "temperature"),
        (
            {"model": "smollm2", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "text only",
        ),
    ],
)
def test_bad_requests_get_a_400_in_openai_shape(smol_server: LiveServer, body: dict, fragment: str):
    reply = httpx.post(smol_server.url + "/v1/chat/completions", json=body, timeout=30)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert fragment in error["message"]


def test_malformed_json_and_unknown_model(smol_server: LiveServer, client: openai.OpenAI):
    reply = httpx.post(
        smol_server.url + "/v1/chat/completions",
        content=b'{"model": "smollm2", "messa',
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert reply.status_code == 400 and "not valid JSON" in reply.json()["error"]["message"]
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="no-such-model", messages=FRANCE)
    assert "no-such-model" in str(missing.value)
    # OpenAI's codes are strings (or null), never the HTTP status
    assert (missing.value.code, missing.value.type) == ("model_not_found", "invalid_request_error")


def test_a_prompt_that_cannot_fit_is_a_400_context_length_exceeded(client: openai.OpenAI):
    huge = "word " * 5000
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": huge}], max_tokens=4
        )
    assert refused.value.code == "context_length_exceeded"
    assert refused.value.param == "messages"
    assert "Input tokens exceed the configured limit of 4096 tokens" in refused.value.message
    assert "--ctx" in refused.value.message  # what sets the limit, and what would raise it
