"""OpenAI Responses against the real server on the real bundled SmolLM2, with the official SDK.

What the model says does not matter here; the shape of what comes back does.
"""

from __future__ import annotations

import openai
import pytest

from tests.live_server import LiveServer

QUESTION = "What is the capital of France? Answer in one sentence."

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client(smol_server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=smol_server.url + "/v1", api_key="unused", max_retries=0)


def test_create_returns_a_completed_response_with_one_message(client: openai.OpenAI):
    reply = client.responses.create(model="smollm2", input=QUESTION, temperature=0, max_output_tokens=32)
    assert reply.id.startswith("resp_") and reply.object == "response"
    assert reply.status in ("completed", "incomplete")
    assert [item.type for item in reply.output] == ["message"]
    message = reply.output[0]
    assert message.id.startswith("msg_") and message.role == "assistant"
    assert [part.type for part in message.content] == ["output_text"]
    assert reply.output_text.strip()
    usage = reply.usage
    assert usage.input_tokens > 0 and usage.output_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.output_tokens_details.reasoning_tokens == 0


def test_the_stream_gives_the_same_greedy_text_as_create(client: openai.OpenAI):
    whole = client.responses.create(model="smollm2", input=QUESTION, temperature=0, max_output_tokens=32)
    with client.responses.stream(
        model="smollm2", input=QUESTION, temperature=0, max_output_tokens=32
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text == final.output_text
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[-1].type == "response.completed"
    numbers = [e.sequence_number for e in events]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)


def test_previous_response_id_continues_the_conversation(client: openai.OpenAI):
    first = client.responses.create(model="smollm2", input=QUESTION, temperature=0, max_output_tokens=16)
    second = client.responses.create(
        model="smollm2",
        previous_response_id=first.id,
        input="And of Italy?",
        temperature=0,
        max_output_tokens=16,
    )
    assert second.previous_response_id == first.id
    # the second prompt holds the first exchange, most of which the prefix pool already has
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens_details.cached_tokens > 0
    stored = client.responses.retrieve(second.id)
    assert stored.id == second.id and stored.output_text == second.output_text


def test_max_output_tokens_makes_an_incomplete_response(client: openai.OpenAI):
    reply = client.responses.create(model="smollm2", input=QUESTION, temperature=0, max_output_tokens=2)
    assert reply.status == "incomplete"
    assert reply.incomplete_details.reason == "max_output_tokens"
    assert reply.usage.output_tokens == 2


def test_an_unknown_previous_response_is_not_found(client: openai.OpenAI):
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.create(model="smollm2", previous_response_id="resp_missing", input="Hi")
    assert caught.value.body["code"] == "previous_response_not_found"
