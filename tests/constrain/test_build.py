"""Which constraint a request gets, once its prompt is rendered with the model's template."""

from __future__ import annotations

import pytest

from kinfer.chat.template import render_prompt
from kinfer.constrain.build import build_constraint
from kinfer.errors import InvalidRequest
from kinfer.protocol import ChatRequest, Message, ResponseFormat, ToolSpec
from tests.chat.chat_helpers import load_template
from tests.constrain.conftest import accepts

HI = (Message("user", "Hi"),)
UNIT = ToolSpec(
    "set_unit", "", {"type": "object", "properties": {"unit": {"enum": ["c", "f"]}}, "required": ["unit"]}
)
CITY = ToolSpec("get_weather", "", {"type": "object", "properties": {"city": {"type": "string"}}})
PERSON = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


def constraint(template: str | None = None, **fields):
    request = ChatRequest(model="m", messages=HI, **fields)
    return build_constraint(request, render_prompt(template, request, bos_token="", eos_token=""))


def test_free_text_gets_no_constraint():
    assert constraint() is None
    assert constraint(tools=(UNIT,), tool_choice="none") is None


def test_a_forced_call_is_the_only_thing_the_reply_may_be(vocab):
    forced = constraint(tools=(UNIT, CITY), tool_choice="required")
    assert (forced.kind, forced.trigger, forced.start_after) == ("tool_call", None, None)
    call = '<tool_call>\n{{"name": "{}", "arguments": {}}}\n</tool_call>'
    assert accepts(vocab, forced.grammar, call.format("get_weather", '{"city": "Oslo"}'))
    named = constraint(tools=(UNIT, CITY), tool_choice="set_unit")
    unit = call.format("set_unit", '{"unit": "c"}')
    assert accepts(vocab, named.grammar, unit)
    assert not accepts(vocab, named.grammar, call.format("get_weather", '{"city": "Oslo"}'))
    assert not accepts(vocab, named.grammar, unit + "\n" + unit)  # a named function is called once
    assert accepts(vocab, forced.grammar, unit + "\n" + unit)  # "required" allows parallel calls
    single = constraint(tools=(UNIT, CITY), tool_choice="required", parallel_tool_calls=False)
    assert not accepts(vocab, single.grammar, unit + "\n" + unit)


def test_tools_on_auto_constrain_only_a_call_the_model_starts():
    lazy = constraint(tools=(UNIT,))
    assert (lazy.kind, lazy.trigger) == ("tool_call", "<tool_call>")


def test_a_response_format_is_json_or_with_tools_on_auto_a_call(vocab):
    answer = constraint(response_format=ResponseFormat("json_schema", PERSON))
    assert answer.kind == "json" and answer.trigger is None
    assert accepts(vocab, answer.grammar, '{"name": "Ada"}')
    assert not accepts(vocab, answer.grammar, "Ada")
    anything = constraint(response_format=ResponseFormat("json_object"))
    assert accepts(vocab, anything.grammar, '{"x": [1, {"y": null}]}')
    either = constraint(response_format=ResponseFormat("json_schema", PERSON), tools=(UNIT,))
    assert either.kind == "json_or_tool_call"
    assert accepts(vocab, either.grammar, '{"name": "Ada"}')
    assert accepts(
        vocab, either.grammar, '<tool_call>\n{"name": "set_unit", "arguments": {"unit": "f"}}\n</tool_call>'
    )


def test_the_models_own_format_and_thinking_come_from_its_template(vocab):
    qwen35 = load_template("qwen3.5-4b.jinja")  # XML calls; opens <think> itself
    forced = constraint(qwen35, tools=(UNIT,), tool_choice="required")
    assert forced.start_after == "</think>"  # thinking stays free
    xml = "<tool_call>\n<function=set_unit>\n<parameter=unit>\nc\n</parameter>\n</function>\n</tool_call>"
    assert accepts(vocab, forced.grammar, xml)
    no_think = constraint(qwen35, tools=(UNIT,), tool_choice="required", think=False)
    assert no_think.start_after is None  # the prompt closed the think block already
    qwen3 = load_template("qwen3-0.6b.jinja")  # Hermes calls; the model opens <think> itself
    lazy = constraint(qwen3, tools=(UNIT,))
    assert (lazy.start_after, lazy.think) == (None, ("<think>", "</think>"))  # a call inside is thought


def test_a_schema_the_engine_cannot_enforce_is_a_400_naming_the_keyword():
    tags = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
    with pytest.raises(InvalidRequest, match="uniqueItems"):
        constraint(response_format=ResponseFormat("json_schema", tags))
    with pytest.raises(InvalidRequest, match=r"tool .tag.*uniqueItems"):
        constraint(
            tools=(ToolSpec("tag", "", {"type": "object", "properties": {"t": tags}}),), tool_choice="tag"
        )
    # tools the model may never call loosen the grammar instead of refusing the request
    assert constraint(tools=(ToolSpec("tag", "", {"type": "object", "properties": {"t": tags}}),)) is not None


def test_a_schema_nested_beyond_reason_is_a_400_not_a_crash():
    deep: dict = {"type": "string"}
    for _ in range(2000):
        deep = {"type": "object", "properties": {"a": deep}}
    with pytest.raises(InvalidRequest, match="nested too deeply"):
        constraint(response_format=ResponseFormat("json_schema", deep))
