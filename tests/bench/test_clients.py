"""Request bodies per dialect, and reading each dialect's stream into counts and times.

The stream lines are what the servers send: kinfer's OpenAI SSE with `include_usage`, llama-cpp-python's
SSE (no usage), Ollama's NDJSON and Anthropic's event stream.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from kinfer.bench.clients import StreamReader, Target, chat_body, chat_path, stream_chat

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


def sse(data: dict | str) -> str:
    return "data: " + (data if isinstance(data, str) else json.dumps(data))


def read(dialect: str, lines: list[str], *, started: float = 0.0, estimate: int = 0):
    reader = StreamReader(dialect, started)  # type: ignore[arg-type]
    for i, line in enumerate(lines):
        reader.feed(line, now=float(i))  # the i-th line arrives at t = i s
    return reader.result(float(len(lines)), prompt_estimate=estimate)


def test_openai_bodies_ask_for_usage_and_carry_the_equal_work_switch():
    target = Target("kinfer", "http://x", "openai", model="smollm2:135m", extra_body={"ignore_eos": True})
    body = chat_body(target, MESSAGES, 64, stream=True)
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 64 and body["temperature"] == 0.0
    assert body["model"] == "smollm2:135m" and body["ignore_eos"] is True
    assert body["messages"] == MESSAGES
    assert chat_path("openai") == "/v1/chat/completions"
    # a server's own default model: no model field at all (mlx_lm maps its absence to its model)
    assert "model" not in chat_body(Target("peer", "http://x"), MESSAGES, 8, stream=False)


def test_ollama_bodies_put_the_length_in_options():
    body = chat_body(Target("k", "http://x", "ollama"), MESSAGES, 32, stream=True)
    assert body["options"] == {"num_predict": 32, "temperature": 0.0}
    assert body["model"] == "" and body["stream"] is True
    assert chat_path("ollama") == "/api/chat"


def test_anthropic_bodies_lift_the_system_prompt_out_of_the_messages():
    body = chat_body(Target("k", "http://x", "anthropic"), MESSAGES, 16, stream=True)
    assert body["system"] == "Be brief."
    assert body["messages"] == [{"role": "user", "content": "Hi"}]
    assert body["max_tokens"] == 16 and body["model"]  # Anthropic's API requires a model name


def test_anthropic_targets_send_the_version_header_and_the_key_both_ways():
    headers = Target("k", "http://x", "anthropic", api_key="sekrit").headers()
    assert headers["anthropic-version"]
    assert headers["x-api-key"] == "sekrit" and headers["Authorization"] == "Bearer sekrit"


def test_openai_stream_counts_tokens_from_usage_and_times_the_text():
    lines = [
        sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
        ": keepalive",
        sse({"choices": [{"index": 0, "delta": {"content": "Hello"}}]}),
        "",
        sse({"choices": [{"index": 0, "delta": {"content": " world"}}]}),
        sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}),
        sse(
            {
                "choices": [],
                "usage": {
                    "prompt_tokens": 40,
                    "completion_tokens": 3,
                    "total_tokens": 43,
                    "prompt_tokens_details": {"cached_tokens": 12},
                },
            }
        ),
        sse("[DONE]"),
    ]
    r = read("openai", lines)
    assert r.ok and r.usage_source == "usage"
    assert (r.prompt_tokens, r.completion_tokens, r.cached_tokens) == (40, 3, 12)
    assert r.first_token == 2.0 and r.last_token == 4.0  # the empty role chunk is not a token
    assert r.text == "Hello world" and r.finish_reason == "length"


def test_a_stream_without_usage_falls_back_to_counting_chunks():
    # llama-cpp-python streams one chunk per token and no usage
    lines = [sse({"choices": [{"delta": {"content": t}, "finish_reason": None}]}) for t in ("a", "b", "c")]
    lines.append(sse({"choices": [{"delta": {}, "finish_reason": "length"}]}))
    r = read("openai", lines, estimate=77)
    assert r.usage_source == "chunks"
    assert r.completion_tokens == 3 and r.prompt_tokens == 77


def test_thinking_counts_as_generated_text():
    r = read("openai", [sse({"choices": [{"delta": {"reasoning_content": "hmm"}}]})])
    assert r.first_token == 0.0 and r.text == "hmm"


def test_an_error_inside_the_stream_fails_the_request():
    lines = [
        sse({"choices": [{"delta": {"content": "a"}}]}),
        sse({"error": {"message": "engine failure", "type": "server_error"}}),
    ]
    r = read("openai", lines)
    assert not r.ok and r.error == "engine failure"


def test_a_stream_that_ends_with_nothing_is_an_error():
    assert read("openai", [sse("[DONE]")]).error == "the stream ended without a reply"


def test_ollama_stream_takes_counts_from_the_final_line():
    lines = [
        json.dumps({"model": "m", "message": {"role": "assistant", "content": "Hi"}, "done": False}),
        json.dumps({"model": "m", "message": {"role": "assistant", "content": "!"}, "done": False}),
        json.dumps(
            {
                "model": "m",
                "message": {"role": "assistant", "content": ""},
                "done": True,
                "done_reason": "length",
                "prompt_eval_count": 31,
                "eval_count": 2,
            }
        ),
    ]
    r = read("ollama", lines)
    assert (r.prompt_tokens, r.completion_tokens, r.usage_source) == (31, 2, "usage")
    assert r.first_token == 0.0 and r.last_token == 1.0 and r.finish_reason == "length"


def test_anthropic_stream_adds_cache_reads_to_the_prompt():
    def event(kind: str, data: dict) -> list[str]:
        return [f"event: {kind}", "data: " + json.dumps({"type": kind, **data}), ""]

    lines = [
        *event(
            "message_start",
            {"message": {"usage": {"input_tokens": 10, "cache_read_input_tokens": 30, "output_tokens": 0}}},
        ),
        *event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
        *event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "Hi"}}),
        *event("content_block_stop", {"index": 0}),
        *event("message_delta", {"delta": {"stop_reason": "max_tokens"}, "usage": {"output_tokens": 1}}),
        *event("message_stop", {}),
    ]
    r = read("anthropic", lines)
    assert (r.prompt_tokens, r.cached_tokens, r.completion_tokens) == (40, 30, 1)
    assert r.finish_reason == "max_tokens" and r.text == "Hi"


def test_anthropic_error_events_fail_the_request():
    lines = ["event: error", "data: " + json.dumps({"type": "error", "error": {"message": "overloaded"}})]
    assert read("anthropic", lines).error == "overloaded"


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_unreadable_lines_are_reported_not_raised(dialect):
    assert "unreadable" in (read(dialect, ["data: {not json"]).error or "")


class FlakyPeer:
    """A minimal HTTP peer on 127.0.0.1 that hangs up on the first `drops` connections before
    answering (as mlx_lm.server does when a burst overflows its listen backlog), then streams."""

    REPLY = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
        + (sse({"choices": [{"delta": {"content": "hi"}}]}) + "\n\n").encode()
        + (sse({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 1}}) + "\n\n").encode()
        + b"data: [DONE]\n\n"
    )

    def __init__(self, drops: int) -> None:
        self.drops = drops
        self.connections = 0

    async def handle(self, reader, writer) -> None:
        self.connections += 1
        await reader.readuntil(b"\r\n\r\n")
        if self.connections > self.drops:
            writer.write(self.REPLY)
            await writer.drain()
        writer.close()


async def chat_with(peer: FlakyPeer):
    server = await asyncio.start_server(peer.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, httpx.AsyncClient(timeout=10) as client:
        return await stream_chat(client, Target("peer", f"http://127.0.0.1:{port}"), MESSAGES, 4)


def test_a_connection_dropped_before_any_response_is_retried():
    peer = FlakyPeer(drops=1)
    result = asyncio.run(chat_with(peer))
    assert result.ok and result.retries == 1 and peer.connections == 2
    assert result.completion_tokens == 1 and result.text == "hi"


def test_retries_give_up_after_two_like_the_openai_sdk():
    peer = FlakyPeer(drops=10)
    result = asyncio.run(chat_with(peer))
    assert not result.ok and result.retries == 2 and peer.connections == 3
