"""Structured output and forced tool calls end to end on the real bundled SmolLM2 (llama.cpp), which
cannot write valid JSON unaided: every dialect, streamed and not, and the client libraries people use
for structured output (the SDKs' parse helpers, pydantic-ai, Instructor).

KINFER_STRUCTURED_REPLIES sets how many sampled replies each dialect must get right (default 2; the
acceptance run used 50).
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Literal

import anthropic
import httpx
import jsonschema
import ollama
import openai
import pytest
from pydantic import BaseModel, Field

from tests.constrain.schemas import PERSON, PERSON_PROMPT, WEATHER_TOOL
from tests.live_server import LiveServer
from tests.server.structured_helpers import ANSWER, CALL, CALL_FINISH, MODEL

pytestmark = pytest.mark.slow

REPLIES = int(os.environ.get("KINFER_STRUCTURED_REPLIES", "2"))
DIALECTS = ("openai", "responses", "anthropic", "ollama")


class Address(BaseModel):
    city: str = Field(max_length=30)
    zip: str = Field(pattern=r"^[0-9]{5}$")


class Person(BaseModel):
    name: str = Field(pattern=r"^[A-Z][a-z]{1,15}$")
    age: int = Field(ge=0, le=120)
    role: Literal["admin", "user", "guest"]
    tags: list[Annotated[str, Field(max_length=12)]] = Field(min_length=1, max_length=3)
    address: Address


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_reply_is_json_valid_against_the_schema(smol_server: LiveServer, dialect: str):
    ask = ANSWER[dialect]
    with ThreadPoolExecutor(4) as pool:  # the server's four rows, busy together
        replies = list(pool.map(lambda seed: ask(smol_server.url, PERSON, seed), range(REPLIES)))
    for reply in replies:
        jsonschema.validate(json.loads(reply), PERSON)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("named", [False, True], ids=["required", "named"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_forced_tool_call_is_always_made_with_valid_arguments(
    smol_server: LiveServer, dialect: str, named: bool, stream: bool
):
    made = CALL[dialect](smol_server.url, named, stream)
    assert made.finish == CALL_FINISH[dialect]
    assert [name for name, _ in made.calls] == ["get_weather"]
    jsonschema.validate(made.calls[0][1], WEATHER_TOOL["parameters"])


def test_a_schema_the_grammar_engine_cannot_enforce_is_a_400_naming_the_keyword(smol_server: LiveServer):
    schema = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tags?"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "tags", "schema": schema}},
    }
    reply = httpx.post(smol_server.url + "/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 400
    assert "uniqueItems" in reply.json()["error"]["message"]


# ---- client libraries ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def openai_client(smol_server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=smol_server.url + "/v1", api_key="unused", max_retries=0)


def test_openai_chat_completions_parse(openai_client: openai.OpenAI):
    reply = openai_client.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": PERSON_PROMPT}],
        response_format=Person,
        max_tokens=200,
    )
    assert isinstance(reply.choices[0].message.parsed, Person)


def test_openai_responses_parse(openai_client: openai.OpenAI):
    reply = openai_client.responses.parse(
        model=MODEL, input=PERSON_PROMPT, text_format=Person, max_output_tokens=200
    )
    assert isinstance(reply.output_parsed, Person)


class Pet(BaseModel):
    """Anthropic's SDK moves bounds and patterns into descriptions (its API does not take them), so
    neither kinfer nor the model sees them: a model without any, for the SDK to check afterwards."""

    name: str
    kind: Literal["cat", "dog", "bird"]
    age: int


def test_anthropic_messages_parse(smol_server: LiveServer):
    client = anthropic.Anthropic(base_url=smol_server.url, api_key="unused", max_retries=0)
    reply = client.messages.parse(
        model=MODEL,
        max_tokens=200,
        messages=[{"role": "user", "content": "My dog Rex is three years old. Describe him as JSON."}],
        extra_body={"temperature": 0},  # this SDK's parse() has no sampling parameters
        output_format=Pet,
    )
    assert isinstance(reply.parsed_output, Pet)


def test_ollama_format_from_a_pydantic_schema(smol_server: LiveServer):
    client = ollama.Client(host=smol_server.url)
    reply = client.chat(
        model=MODEL, messages=[{"role": "user", "content": PERSON_PROMPT}], format=Person.model_json_schema()
    )
    Person.model_validate_json(reply.message.content)


def test_pydantic_ai_output_type(smol_server: LiveServer):
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel(
        MODEL, provider=OpenAIProvider(base_url=smol_server.url + "/v1", api_key="unused")
    )
    agent = Agent(model, output_type=Person)
    assert isinstance(agent.run_sync(PERSON_PROMPT).output, Person)


def test_instructor_response_model(smol_server: LiveServer):
    import instructor

    client = instructor.from_openai(
        openai.OpenAI(base_url=smol_server.url + "/v1", api_key="unused", max_retries=0)
    )
    person = client.chat.completions.create(
        model=MODEL,
        response_model=Person,
        messages=[{"role": "user", "content": PERSON_PROMPT}],
        max_retries=0,
    )
    assert isinstance(person, Person)
