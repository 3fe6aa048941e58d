"""Anthropic Messages against the real server on the real bundled SmolLM2, with the official SDK.

What the model says does not matter here; the shape of what comes back does.
"""

from __future__ import annotations

import anthropic
import pytest

from tests.live_server import LiveServer

# the SDK no longer has sampling arguments; older clients and curl still send them, so kinfer reads them
GREEDY = {"temperature": 0}
FRANCE = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client(smol_server: LiveServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=smol_server.url, api_key="unused", max_retries=0)


def test_create_answers_in_anthropics_shape(client: anthropic.Anthropic):
    reply = client.messages.create(model="smollm2", max_tokens=32, extra_body=GREEDY, messages=FRANCE)
    assert reply.id.startswith("msg_") and reply.type == "message" and reply.role == "assistant"
    assert reply.model == "smollm2"
    assert [b.type for b in reply.content] == ["text"] and reply.content[0].text.strip()
    assert reply.stop_reason in ("end_turn", "max_tokens")
    assert reply.usage.output_tokens > 0
    assert reply.usage.cache_creation_input_tokens == 0
    counted = client.messages.count_tokens(model="smollm2", messages=FRANCE)
    assert reply.usage.input_tokens + reply.usage.cache_read_input_tokens == counted.input_tokens


def test_the_stream_gives_the_same_greedy_text_as_create(client: anthropic.Anthropic):
    whole = client.messages.create(model="smollm2", max_tokens=32, extra_body=GREEDY, messages=FRANCE)
    with client.messages.stream(model="smollm2", max_tokens=32, extra_body=GREEDY, messages=FRANCE) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text == final.content[0].text
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_max_tokens_cuts_the_reply(client: anthropic.Anthropic):
    reply = client.messages.create(model="smollm2", max_tokens=3, extra_body=GREEDY, messages=FRANCE)
    assert reply.stop_reason == "max_tokens"
    assert reply.usage.output_tokens == 3


def test_system_blocks_thinking_and_tools_are_accepted_by_a_model_without_them(client: anthropic.Anthropic):
    reply = client.messages.create(
        model="smollm2",
        max_tokens=16,
        extra_body=GREEDY,
        system=[{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
        thinking={"type": "disabled"},
        tools=[{"name": "noop", "description": "Does nothing.", "input_schema": {"type": "object"}}],
        tool_choice={"type": "auto"},
        messages=FRANCE,
    )
    assert reply.content and reply.content[0].type == "text"


def test_count_tokens_grows_with_the_system_prompt(client: anthropic.Anthropic):
    bare = client.messages.count_tokens(model="smollm2", messages=FRANCE).input_tokens
    with_system = client.messages.count_tokens(
        model="smollm2", system="You answer in French, always.", messages=FRANCE
    ).input_tokens
    assert bare > 10 and with_system != bare


def test_message_start_already_reports_the_cached_part_of_the_prompt(client: anthropic.Anthropic):
    """The prefix lookup happens when the request takes its row, before `message_start` is sent: the
    split it reports is the one `message_delta` reports at the end (Claude Code reads both)."""
    rules = "\n".join(f"Rule {i}: keep every answer short and plain." for i in range(12))

    def stream_usages(question: str):
        messages = [{"role": "user", "content": question}]
        with client.messages.stream(
            model="smollm2", max_tokens=4, extra_body=GREEDY, system=rules, messages=messages
        ) as stream:
            events = list(stream)
        (start,) = [e.message.usage for e in events if e.type == "message_start"]
        (delta,) = [e.usage for e in events if e.type == "message_delta"]
        return start, delta

    stream_usages("Name a colour.")  # leaves the system prompt in the prefix pool
    start, delta = stream_usages("Name a fruit.")

    assert start.cache_read_input_tokens > 0
    assert start.cache_read_input_tokens == delta.cache_read_input_tokens
    assert start.input_tokens == delta.input_tokens
