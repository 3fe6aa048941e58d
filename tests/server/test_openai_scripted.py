"""OpenAI Chat Completions where the exact shape matters: the scripted engine writes the reply."""

from __future__ import annotations

import json

import httpx

HI = [{"role": "user", "content": "Hi."}]


def chunks_of(url: str, path: str, body: dict) -> list[dict]:
    """The JSON chunks of a streamed reply, without the closing `data: [DONE]`."""
    text = httpx.post(url + path, json={"model": "smollm2", "stream": True, **body}).text
    lines = [line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_the_message_says_refusal_null(scripted) -> None:
    """OpenAI's assistant message always carries `refusal` (null unless the model refused)."""
    with scripted(lambda prompt: "Hello!") as s:
        body = httpx.post(s.url + "/v1/chat/completions", json={"model": "smollm2", "messages": HI}).json()
        chunks = chunks_of(s.url, "/v1/chat/completions", {"messages": HI})
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Hello!", "refusal": None}
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None}


def test_with_include_usage_every_chunk_has_usage_null_until_the_last(scripted) -> None:
    usage = {"stream_options": {"include_usage": True}}
    with scripted(lambda prompt: "Hello!") as s:
        chat = chunks_of(s.url, "/v1/chat/completions", {"messages": HI, **usage})
        plain = chunks_of(s.url, "/v1/chat/completions", {"messages": HI})
        legacy = chunks_of(s.url, "/v1/completions", {"prompt": "Hi", **usage})
    for chunks in (chat, legacy):
        *before, last = chunks
        assert before and all("usage" in c and c["usage"] is None for c in before)
        assert last["choices"] == [] and last["usage"]["completion_tokens"] == len("Hello!")
    assert all("usage" not in c for c in plain)  # without the option there is no usage field at all
