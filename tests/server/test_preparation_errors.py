"""A prompt that cannot be prepared (the template raises, the tokenizer fails) is that request's 400,
in its dialect's error shape, while a reply already streaming carries on (scripted engine)."""

from __future__ import annotations

import threading

import httpx
import pytest

from tests.scripted_engine import CHATML
from tests.server.dialect_helpers import read_sse

POISON = "\ufffe"  # the scripted tokenizer fails on it
REFUSING = (
    "{% for m in messages %}{% if 'boom' in m.content %}{{ raise_exception('no booms here') }}"
    "{% endif %}{% endfor %}" + CHATML
)

# (path, body for one user message, the error's message read from the dialect's envelope)
DIALECTS = {
    "openai": (
        "/v1/chat/completions",
        lambda text: {"model": "smollm2", "stream": True, "messages": [{"role": "user", "content": text}]},
        lambda body: body["error"]["message"],
    ),
    "anthropic": (
        "/v1/messages",
        lambda text: {
            "model": "smollm2",
            "stream": True,
            "max_tokens": 64,
            "messages": [{"role": "user", "content": text}],
        },
        lambda body: body["type"] == "error" and body["error"]["message"],
    ),
    "ollama": (
        "/api/chat",
        lambda text: {"model": "smollm2", "messages": [{"role": "user", "content": text}]},
        lambda body: body["error"],
    ),
    "responses": (
        "/v1/responses",
        lambda text: {"model": "smollm2", "stream": True, "input": text},
        lambda body: body["error"]["message"],
    ),
}


def long_reply(prompt: str) -> str:
    return "word " * 100  # a token a character: 500 steps


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_a_tokenizer_failure_is_a_400_in_the_dialects_shape_and_the_running_reply_finishes(scripted, dialect):
    path, body, message = DIALECTS[dialect]
    with scripted(long_reply, engine={"tokenize_fails_on": POISON, "step_delay": 0.005}) as s:
        running: dict = {}

        def stream() -> None:
            request = DIALECTS["openai"][1]("tell me") | {"max_tokens": 1000}
            reply = httpx.post(s.url + "/v1/chat/completions", json=request, timeout=60)
            running["status"] = reply.status_code
            running["text"] = "".join(
                choice["delta"].get("content") or ""
                for _, chunk in read_sse(reply.text)
                for choice in chunk.get("choices", [])
            )

        streamer = threading.Thread(target=stream)
        streamer.start()
        refused = httpx.post(s.url + path, json=body(f"bad {POISON} text"), timeout=60)
        streamer.join(60)
    assert refused.status_code == 400, refused.text
    assert "could not prepare the prompt" in message(refused.json())
    assert running["status"] == 200 and running["text"] == long_reply("")


def test_a_template_that_raises_is_a_400_naming_the_templates_words(scripted):
    path, body, message = DIALECTS["openai"]
    with scripted(long_reply, REFUSING) as s:
        refused = httpx.post(s.url + path, json=body("this goes boom"), timeout=60)
        fine = httpx.post(s.url + path, json=body("fine") | {"stream": False, "max_tokens": 3}, timeout=60)
    assert refused.status_code == 400 and "no booms here" in message(refused.json())
    assert fine.status_code == 200
