"""The streaming tool-call parser on replies shaped like real Qwen3 (Hermes JSON) and Qwen3.5 (XML) output."""

from __future__ import annotations

import re

import pytest

from kinfer.chat.tool_calls import ToolCallParser
from kinfer.chat.tool_formats import convert_value, parse_call_body
from kinfer.protocol import Delta, ToolCall, ToolCallEvent
from tests.chat.chat_helpers import TOOLS, blank_id, comparable, feed_all, splits


def call(name: str, arguments: dict, index: int) -> ToolCallEvent:
    return ToolCallEvent(ToolCall("", name, arguments), index)


HERMES_ONE = (
    "Let me check the weather for you.\n\n"
    "<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris", "units": "celsius"}}\n'
    "</tool_call>"
)
HERMES_TWO = (
    "<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
    "</tool_call>\n"
    "<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Tokyo", "days": 2}}\n'
    "</tool_call>"
)
XML_TWO_WITH_PROSE = (
    "I'll look up both cities.\n\n"
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n"
    "<tool_call>\n<function=search>\n<parameter=query>\nTokyo weather\nnext week\n</parameter>\n"
    '<parameter=filters>\n{"lang": "en", "safe": true}\n</parameter>\n'
    "<parameter=limit>\n2.5\n</parameter>\n</function>\n</tool_call>\n"
    "Both requests are on their way."
)

SAFE_EN = {"lang": "en", "safe": True}

CASES = [
    pytest.param(
        HERMES_ONE,
        [
            Delta("Let me check the weather for you."),
            call("get_weather", {"city": "Paris", "units": "celsius"}, 0),
        ],
        id="hermes-prose-then-call",
    ),
    pytest.param(
        HERMES_TWO,
        [call("get_weather", {"city": "Paris"}, 0), call("get_weather", {"city": "Tokyo", "days": 2}, 1)],
        id="hermes-two-calls",
    ),
    pytest.param(
        XML_TWO_WITH_PROSE,
        [
            Delta("I'll look up both cities."),
            call("get_weather", {"city": "Paris", "days": 3}, 0),
            call(
                "search",
                {"query": "Tokyo weather\nnext week", "filters": {"lang": "en", "safe": True}, "limit": 2.5},
                1,
            ),
            Delta("\nBoth requests are on their way."),
        ],
        id="xml-two-calls-prose-before-and-after",
    ),
    pytest.param(
        'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>',
        [Delta('Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>')],
        id="bad-json-left-as-text",
    ),
    pytest.param(
        '<tool_call>\n{"arguments": {"city": "Paris"}}\n</tool_call>',
        [Delta('<tool_call>\n{"arguments": {"city": "Paris"}}\n</tool_call>')],
        id="missing-name-left-as-text",
    ),
    pytest.param(
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</tool_call>",
        [Delta("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</tool_call>")],
        id="xml-without-function-close-left-as-text",
    ),
    pytest.param(
        'Calling now.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',
        [Delta('Calling now.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par')],
        id="unterminated-call-left-as-text",
    ),
    pytest.param(
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
        "<tool_call>\nnot a call\n</tool_call>",
        [call("get_weather", {"city": "Oslo"}, 0), Delta("\n<tool_call>\nnot a call\n</tool_call>")],
        id="good-then-malformed",
    ),
    pytest.param(
        "Use the <tool_ prefix carefully: <tool_cal and <tool_call",
        [Delta("Use the <tool_ prefix carefully: <tool_cal and <tool_call")],
        id="tag-lookalikes-are-prose",
    ),
    pytest.param(
        "No tools needed. The answer is 4.\n",
        [Delta("No tools needed. The answer is 4.\n")],
        id="plain-answer-untouched",
    ),
]


@pytest.mark.parametrize(("reply", "expected"), CASES)
def test_parse_whole_reply(reply: str, expected: list) -> None:
    assert comparable(feed_all(ToolCallParser(TOOLS), [reply])) == expected


@pytest.mark.parametrize(("reply", "expected"), CASES)
def test_split_at_every_position_gives_the_same_events(reply: str, expected: list) -> None:
    for chunks in splits(reply):
        assert comparable(feed_all(ToolCallParser(TOOLS), chunks)) == expected, chunks


def test_prose_streams_live_and_a_call_goes_out_the_moment_it_closes() -> None:
    parser = ToolCallParser(TOOLS)
    body = '\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'

    assert parser.feed("Let me check.") == [Delta("Let me check.")]
    assert parser.feed(" <tool") == []  # could be the start of <tool_call>
    assert parser.feed("_call>" + body + "</tool_call") == []
    (event,) = parser.feed(">")

    assert blank_id(event) == call("get_weather", {"city": "Paris"}, 0)
    assert parser.calls_seen == 1


def test_call_ids_are_openai_style_and_unique() -> None:
    events = feed_all(ToolCallParser(TOOLS), [HERMES_TWO])
    ids = [e.call.id for e in events if isinstance(e, ToolCallEvent)]

    assert len(set(ids)) == 2
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", i) for i in ids)


def test_hermes_arguments_given_as_a_json_string_are_decoded() -> None:
    parsed = parse_call_body('{"name": "search", "arguments": "{\\"query\\": \\"kinfer\\"}"}')

    assert parsed is not None
    assert (parsed.name, parsed.arguments) == ("search", {"query": "kinfer"})


def test_llama_style_parameters_key_is_accepted() -> None:
    parsed = parse_call_body('{"name": "search", "parameters": {"query": "kinfer"}}')

    assert parsed is not None and parsed.arguments == {"query": "kinfer"}


@pytest.mark.parametrize(
    ("text", "schema", "value"),
    [
        pytest.param("123", {"type": "string"}, "123", id="string-stays-text"),
        pytest.param('{"a": 1}', {"type": "string"}, '{"a": 1}', id="json-looking-string-stays-text"),
        pytest.param("3", {"type": "integer"}, 3, id="integer"),
        pytest.param("2.5", {"type": "number"}, 2.5, id="number"),
        pytest.param("true", {"type": "boolean"}, True, id="boolean"),
        pytest.param("False", {"type": "boolean"}, False, id="python-boolean"),
        pytest.param('["a", "b"]', {"type": "array"}, ["a", "b"], id="array"),
        pytest.param("null", {"type": ["string", "null"]}, None, id="nullable-string-null"),
        pytest.param("42", None, 42, id="no-schema-json"),
        pytest.param("Paris", None, "Paris", id="no-schema-text"),
        pytest.param("celsius", {"enum": ["celsius", "fahrenheit"]}, "celsius", id="string-enum"),
    ],
)
def test_xml_values_follow_the_schema(text: str, schema: dict | None, value: object) -> None:
    assert convert_value(text, schema) == value


def test_xml_value_keeps_inner_newlines_and_indentation() -> None:
    code = "def f():\n    return 1\n"
    body = f"<function=search>\n<parameter=query>\n{code}\n</parameter>\n</function>"

    parsed = parse_call_body(body, TOOLS)

    assert parsed is not None and parsed.arguments == {"query": code}


@pytest.mark.parametrize("levels", [150, 5000])
def test_a_call_nested_deeper_than_any_reply_can_carry_is_not_a_call(levels: int) -> None:
    # a reply goes out through json.dumps, which recurses: such a call would fail there (a 500)
    deep = "[" * levels + "]" * levels
    assert parse_call_body(f'{{"name": "f", "arguments": {{"x": {deep}}}}}') is None
    assert parse_call_body(f'{{"name": "f", "arguments": "{{\\"x\\": {deep}}}"}}') is None
    assert convert_value(deep, {"type": "array"}) == deep  # kept as the text the model wrote
    assert convert_value("[[1]]", {"type": "array"}) == [[1]]
