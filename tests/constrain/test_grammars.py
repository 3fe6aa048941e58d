"""Grammars for JSON Schema and the two tool-call formats: what they take, and what they refuse."""

from __future__ import annotations

import json

import pytest

from kinfer.chat.tool_formats import parse_call_body
from kinfer.constrain.grammars import SchemaError, check_schema, closed_objects, json_rule, tool_call_rules
from kinfer.protocol import ToolSpec
from tests.constrain.conftest import accepts

WEATHER = ToolSpec(
    "get_weather",
    "Weather for a city",
    {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city"],
    },
)
UNITS = ToolSpec(
    "set_unit", "", {"type": "object", "properties": {"unit": {"enum": ["c", "f"]}}, "required": ["unit"]}
)


def answer(schema: dict) -> str:
    return "start: answer\nanswer: " + json_rule(schema)


def calls(tools, fmt="hermes", parallel=False) -> str:
    return "start: calls\n" + tool_call_rules(tools, fmt, parallel=parallel)


def test_json_is_written_one_way_with_objects_closed(vocab):
    grammar = answer(WEATHER.parameters)
    assert accepts(vocab, grammar, '{"city": "Paris", "days": 3}')
    assert accepts(vocab, grammar, '{"city": "Paris"}')
    assert not accepts(vocab, grammar, '{"city":"Paris"}')  # kinfer's layout only: ", " and ": "
    assert not accepts(vocab, grammar, '{\n  "city": "Paris"\n}')
    assert not accepts(vocab, grammar, '{"city": "Paris", "days": 9}')  # out of bounds
    assert not accepts(vocab, grammar, '{"days": 3}')  # city is required
    assert not accepts(vocab, grammar, '{"city": "Paris", "mood": "sunny"}')  # no invented properties


def test_objects_that_list_their_properties_are_closed_unless_they_say_otherwise():
    schema = {
        "type": "object",
        "properties": {"a": {"type": "object", "properties": {"b": {"type": "string"}}}},
        "$defs": {"D": {"properties": {"x": {}}, "additionalProperties": True}},
        "allOf": [{"properties": {"c": {}}}],
    }
    closed = closed_objects(schema)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["a"]["additionalProperties"] is False
    assert closed["$defs"]["D"]["additionalProperties"] is True  # said otherwise
    assert "additionalProperties" not in closed["allOf"][0]  # a part of a whole stays open
    assert "additionalProperties" not in schema  # the caller's schema is left alone


@pytest.mark.parametrize(
    ("schema", "keyword"),
    [
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
        ({"if": {"type": "string"}, "then": {"minLength": 1}}, "if"),
        ({"type": "string", "format": "no-such-format"}, "no-such-format"),
        ({"type": "string", "pattern": "(?=a)"}, "look-around"),
    ],
)
def test_a_schema_the_engine_cannot_enforce_is_refused_by_name(schema, keyword):
    with pytest.raises(SchemaError, match="the response format's schema cannot be enforced") as caught:
        check_schema(schema, "the response format's schema")
    assert keyword in str(caught.value)


def test_lenient_schemas_drop_the_keywords_the_engine_does_not_implement(vocab):
    schema = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    check_schema(schema, "tool parameters", lenient=True)
    grammar = "start: answer\nanswer: " + json_rule(schema, lenient=True)
    assert accepts(vocab, grammar, "[1, 1]")  # looser: uniqueItems is not enforced


def test_what_pydantic_writes_compiles():
    schema = {
        "$defs": {
            "Address": {
                "properties": {"zip": {"pattern": "^[0-9]{5}$", "title": "Zip", "type": "string"}},
                "required": ["zip"],
                "title": "Address",
                "type": "object",
            }
        },
        "properties": {
            "name": {"title": "Name", "type": "string"},
            "address": {"$ref": "#/$defs/Address"},
            "nick": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
        },
        "required": ["name", "address"],
        "title": "Person",
        "type": "object",
    }
    check_schema(schema, "schema")


def test_a_hermes_call_is_the_models_own_text_and_parses_back(vocab):
    grammar = calls([WEATHER, UNITS])
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
    assert accepts(vocab, grammar, text)
    call = parse_call_body(text.removeprefix("<tool_call>").removesuffix("</tool_call>"))
    assert (call.name, call.arguments) == ("get_weather", {"city": "Paris", "days": 2})
    assert accepts(
        vocab, grammar, '<tool_call>\n{"name": "set_unit", "arguments": {"unit": "c"}}\n</tool_call>'
    )
    assert not accepts(vocab, grammar, '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
    assert not accepts(
        vocab, grammar, '<tool_call>\n{"name": "set_unit", "arguments": {"unit": "k"}}\n</tool_call>'
    )
    assert not accepts(
        vocab, grammar, 'Sure! <tool_call>\n{"name": "set_unit", "arguments": {"unit": "c"}}\n</tool_call>'
    )


def test_parallel_calls_go_one_per_line_only_when_allowed(vocab):
    one = '<tool_call>\n{"name": "set_unit", "arguments": {"unit": "c"}}\n</tool_call>'
    assert accepts(vocab, calls([UNITS], parallel=True), one + "\n" + one)
    assert not accepts(vocab, calls([UNITS], parallel=False), one + "\n" + one)


def test_an_xml_call_keeps_string_values_raw_and_others_json(vocab):
    grammar = calls([WEATHER, UNITS], "qwen3_5_xml")
    text = (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nSaint-Denis <b>\nnord</b>\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
    )
    assert accepts(vocab, grammar, text)
    call = parse_call_body(text.removeprefix("<tool_call>").removesuffix("</tool_call>"), (WEATHER,))
    assert call.arguments == {"city": "Saint-Denis <b>\nnord</b>", "days": 3}
    no_days = (
        "<tool_call>\n<function=get_weather>\n"
        "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
    )
    assert accepts(vocab, grammar, no_days)
    no_city = (
        "<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
    )
    assert not accepts(vocab, grammar, no_city)
    bad_days = no_days.replace(
        "</parameter>\n</function>", "</parameter>\n<parameter=days>\nten\n</parameter>\n</function>"
    )
    assert not accepts(vocab, grammar, bad_days)
    unit = "<tool_call>\n<function=set_unit>\n<parameter=unit>\n{}\n</parameter>\n</function>\n</tool_call>"
    assert accepts(vocab, grammar, unit.format("f"))
    assert not accepts(vocab, grammar, unit.format("kelvin"))


def test_an_xml_json_parameter_resolves_the_tools_own_definitions(vocab):
    tool = ToolSpec(
        "ship",
        "",
        {
            "type": "object",
            "properties": {"to": {"$ref": "#/$defs/Address"}},
            "required": ["to"],
            "$defs": {
                "Address": {"type": "object", "properties": {"zip": {"type": "string"}}, "required": ["zip"]}
            },
        },
    )
    text = (
        "<tool_call>\n<function=ship>\n"
        '<parameter=to>\n{"zip": "75001"}\n</parameter>\n</function>\n</tool_call>'
    )
    assert accepts(vocab, calls([tool], "qwen3_5_xml"), text)
    assert json.loads('{"zip": "75001"}') == parse_call_body(text[11:-12], (tool,)).arguments["to"]
