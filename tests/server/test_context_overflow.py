"""A prompt longer than a row holds, in each dialect: the official status, type and code, or truncation.

OpenAI Chat and Completions, and Responses with `truncation: "disabled"` (its default), answer 400
`context_length_exceeded`; Responses with `truncation: "auto"` and Ollama (by default) drop the oldest
messages, keeping the system prompt, and answer. Anthropic's case is in test_anthropic_errors. The
scripted engine's tokens are characters and its row holds 300 of them here.
"""

from __future__ import annotations

import httpx
import openai
import pytest

SMALL_ROW = {"ctx": 300}
SYSTEM = {"role": "system", "content": "Be brief."}
HISTORY = [
    {"role": "user", "content": "the oldest question " * 6},
    {"role": "assistant", "content": "the oldest answer " * 6},
    {"role": "user", "content": "a newer question " * 4},
    {"role": "assistant", "content": "a newer answer " * 4},
    {"role": "user", "content": "And now?"},
]
TOO_LONG = [{"role": "user", "content": "word " * 100}]


@pytest.fixture
def server(scripted):
    with scripted(lambda prompt: "Fine.", engine=SMALL_ROW) as s:
        yield s


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_openai_chat_says_context_length_exceeded(server):
    with pytest.raises(openai.BadRequestError) as refused:
        client(server).chat.completions.create(model="smollm2", messages=TOO_LONG)
    error = refused.value
    assert (error.code, error.type, error.param) == (
        "context_length_exceeded",
        "invalid_request_error",
        "messages",
    )
    assert error.body["message"].startswith(
        "Input tokens exceed the configured limit of 300 tokens. Your messages resulted in "
    )


def test_openai_completions_names_the_prompt(server):
    with pytest.raises(openai.BadRequestError) as refused:
        client(server).completions.create(model="smollm2", prompt="word " * 100)
    assert (refused.value.code, refused.value.param) == ("context_length_exceeded", "prompt")


def test_responses_refuses_by_default_with_the_code_codex_stops_on(server):
    with pytest.raises(openai.BadRequestError) as refused:
        client(server).responses.create(model="smollm2", input=TOO_LONG)
    assert (refused.value.code, refused.value.param) == ("context_length_exceeded", "input")
    assert "Your input resulted in" in refused.value.body["message"]


def test_responses_truncation_auto_drops_the_oldest_items_but_not_the_instructions(server):
    reply = client(server).responses.create(
        model="smollm2", instructions="Be brief.", input=HISTORY, truncation="auto"
    )
    assert reply.output_text == "Fine." and reply.truncation == "auto"
    prompt = server.prompts[-1]
    assert prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert "And now?" in prompt and "the oldest question" not in prompt


def test_responses_truncation_disabled_refuses_the_same_input(server):
    with pytest.raises(openai.BadRequestError):
        client(server).responses.create(
            model="smollm2", instructions="Be brief.", input=HISTORY, truncation="disabled"
        )


def test_ollama_drops_the_oldest_turns_by_default(server):
    body = {"model": "smollm2", "messages": [SYSTEM, *HISTORY], "stream": False}
    reply = httpx.post(server.url + "/api/chat", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    assert reply.json()["message"]["content"] == "Fine."
    prompt = server.prompts[-1]
    assert prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert "And now?" in prompt and "the oldest question" not in prompt
    assert reply.json()["prompt_eval_count"] < 300


def test_ollama_truncate_false_is_a_400(server):
    body = {"model": "smollm2", "messages": [SYSTEM, *HISTORY], "stream": False, "truncate": False}
    reply = httpx.post(server.url + "/api/chat", json=body, timeout=30)
    assert reply.status_code == 400
    message = reply.json()["error"]
    assert message.startswith("the input length exceeds the context length: ")
    assert "tokens > 300" in message


def test_ollama_refuses_what_cannot_fit_even_truncated(server):
    body = {"model": "smollm2", "messages": TOO_LONG, "stream": False}
    reply = httpx.post(server.url + "/api/chat", json=body, timeout=30)
    assert reply.status_code == 400 and "exceeds the context length" in reply.json()["error"]


@pytest.mark.parametrize("path", ["/api/chat", "/api/generate"])
def test_ollama_needs_a_model(server, path: str):
    body = {"messages": HISTORY, "prompt": "Hi", "stream": False}
    reply = httpx.post(server.url + path, json=body, timeout=30)
    assert (reply.status_code, reply.json()) == (400, {"error": "model is required"})
