"""Structured output and forced tool calls as each dialect spells them, translated (no server, no model)."""

from __future__ import annotations

import pytest

from kinfer.errors import InvalidRequest
from kinfer.protocol import ResponseFormat, validate_request
from kinfer.server import anthropic_wire, ollama_wire, openai_wire, responses_wire
from kinfer.server.responses import to_request as responses_request
from kinfer.server.responses_tools import to_tools
from kinfer.server.wire import parse_wire

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
WEATHER = {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
HI = [{"role": "user", "content": "hi"}]


def openai(**fields):
    body = parse_wire(openai_wire.ChatCompletionRequest, {"model": "m", "messages": HI, **fields})
    return openai_wire.to_request(body, "chatcmpl-1")


def responses(**fields):
    body = parse_wire(responses_wire.ResponsesBody, {"model": "m", "input": "hi", **fields})
    return responses_request(body, "r", body.input, to_tools(body.tools))[0]


def anthropic(**fields):
    body = parse_wire(anthropic_wire.MessagesBody, {"model": "m", "max_tokens": 9, "messages": HI, **fields})
    return anthropic_wire.to_request(body, "msg_1")


def ollama(**fields):
    return ollama_wire.to_chat_request(
        parse_wire(ollama_wire.ChatBody, {"model": "m", "messages": HI, **fields}), "o"
    )


def test_every_dialect_spells_a_json_schema_its_own_way():
    named = ResponseFormat("json_schema", SCHEMA, name="person", strict=True)
    assert (
        openai(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": SCHEMA, "strict": True},
            }
        ).response_format
        == named
    )
    assert (
        responses(
            text={"format": {"type": "json_schema", "name": "person", "schema": SCHEMA, "strict": True}}
        ).response_format
        == named
    )
    assert ollama(format=SCHEMA).response_format == ResponseFormat("json_schema", SCHEMA)
    assert (
        anthropic(output_config={"format": {"type": "json_schema", "schema": SCHEMA}}).response_format.schema
        == SCHEMA
    )
    assert anthropic(output_format={"type": "json_schema", "schema": SCHEMA}).response_format.schema == SCHEMA


def test_json_mode_and_plain_text():
    json_object = ResponseFormat("json_object")
    assert openai(response_format={"type": "json_object"}).response_format == json_object
    assert responses(text={"format": {"type": "json_object"}}).response_format == json_object
    assert ollama(format="json").response_format == json_object
    assert openai(response_format={"type": "text"}).response_format is None
    assert responses(text={"format": {"type": "text"}}).response_format is None
    assert ollama(format="").response_format is None


@pytest.mark.parametrize(
    ("make", "fields", "where"),
    [
        (openai, {"response_format": {"type": "json_schema"}}, "response_format.json_schema.schema"),
        (openai, {"response_format": {"type": "xml"}}, "response_format.type"),
        (responses, {"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
        (
            anthropic,
            {"output_config": {"format": {"type": "yaml", "schema": {}}}},
            "output_config.format.type",
        ),
        (ollama, {"format": "yaml"}, "format"),
    ],
)
def test_a_malformed_format_is_a_400_naming_its_field(make, fields, where):
    with pytest.raises(InvalidRequest, match=where.replace(".", r"\.")):
        make(**fields)


def test_forced_tool_calls_and_one_call_only():
    tools = [{"type": "function", "function": WEATHER}]
    required = openai(tools=tools, tool_choice="required", parallel_tool_calls=False)
    assert (required.tool_choice, required.parallel_tool_calls) == ("required", False)
    named = openai(tools=tools, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert (named.tool_choice, named.parallel_tool_calls) == ("get_weather", True)
    flat = [{"type": "function", **WEATHER}]
    assert (
        responses(tools=flat, tool_choice={"type": "function", "name": "get_weather"}).tool_choice
        == "get_weather"
    )
    assert (
        responses(tools=flat, tool_choice="required", parallel_tool_calls=False).parallel_tool_calls is False
    )
    claude = [{"name": "get_weather", "input_schema": WEATHER["parameters"]}]
    any_tool = anthropic(tools=claude, tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert (any_tool.tool_choice, any_tool.parallel_tool_calls) == ("required", False)
    assert (
        anthropic(tools=claude, tool_choice={"type": "tool", "name": "get_weather"}).tool_choice
        == "get_weather"
    )
    # Ollama has no tool_choice: kinfer takes OpenAI's as an extension
    assert ollama(tools=tools, tool_choice="required").tool_choice == "required"
    assert (
        ollama(tools=tools, tool_choice={"type": "function", "function": {"name": "get_weather"}}).tool_choice
        == "get_weather"
    )


def test_a_forced_call_needs_a_tool_to_call():
    with pytest.raises(InvalidRequest, match="needs tools"):
        validate_request(openai(tool_choice="required"))
    with pytest.raises(InvalidRequest, match="not among the tools"):
        validate_request(
            openai(
                tools=[{"type": "function", "function": WEATHER}],
                tool_choice={"type": "function", "function": {"name": "nope"}},
            )
        )


def test_the_response_object_echoes_text_format():
    text = {"format": {"type": "json_schema", "name": "person", "schema": SCHEMA, "strict": True}}
    body = parse_wire(responses_wire.ResponsesBody, {"model": "m", "input": "hi", "text": text})
    assert responses_wire.text_json(body.text) == text
    assert responses_wire.text_json(None) == {"format": {"type": "text"}}
