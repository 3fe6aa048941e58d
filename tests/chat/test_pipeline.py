"""The output pipeline the scheduler feeds: thinking split first, then tool calls, only with tools."""

from __future__ import annotations

import pytest

from kinfer.chat.pipeline import OutputPipeline
from kinfer.chat.template import render_prompt
from kinfer.chat.traits import TemplateTraits, analyze_template
from kinfer.protocol import ChatRequest, Delta, Message, ToolCall, ToolCallEvent
from tests.chat.chat_helpers import TOOLS, comparable, feed_all, load_template, splits

QWEN3 = TemplateTraits(supports_thinking=True, has_think_switch=True, tool_format="hermes")
QWEN35 = TemplateTraits(supports_thinking=True, has_think_switch=True, tool_format="qwen3_5_xml")

REASONING = "The user wants the weather. I could write <tool_call> here but I am only thinking."
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
THINK_THEN_CALL = f"<think>\n{REASONING}\n</think>\n\n{CALL_TEXT}"


def call(name: str, arguments: dict, index: int) -> ToolCallEvent:
    return ToolCallEvent(ToolCall("", name, arguments), index)


def test_a_tool_call_inside_thinking_is_thinking_and_the_real_call_is_parsed() -> None:
    expected = [
        Delta(
            "The user wants the weather. I could write <tool_call> here but I am only thinking.", "thinking"
        ),
        call("get_weather", {"city": "Paris"}, 0),
    ]
    for chunks in splits(THINK_THEN_CALL):
        pipeline = OutputPipeline(QWEN3, starts_in_thinking=False, tools=TOOLS)

        assert comparable(feed_all(pipeline, chunks)) == expected, chunks
        assert pipeline.tool_calls_seen == 1


def test_without_tools_in_the_request_tool_call_text_is_just_text() -> None:
    pipeline = OutputPipeline(QWEN3, starts_in_thinking=False)

    out = comparable(feed_all(pipeline, [THINK_THEN_CALL]))

    assert out[1] == Delta(
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    )
    assert pipeline.tool_calls_seen == 0


def test_a_template_without_thinking_leaves_think_tags_alone() -> None:
    traits = analyze_template(load_template("smollm2-135m-instruct.jinja"))
    pipeline = OutputPipeline(traits, starts_in_thinking=False)

    out = feed_all(pipeline, ["<think>not special here</think> ok"])

    assert comparable(out) == [Delta("<think>not special here</think> ok")]


@pytest.mark.parametrize("think", [None, True, False])
def test_qwen35_prompt_and_pipeline_agree_on_where_the_reply_starts(think: bool | None) -> None:
    template = load_template("qwen3.5-4b.jinja")
    request = ChatRequest(
        model="qwen3.5", messages=(Message("user", "Weather in Oslo?"),), tools=TOOLS, think=think
    )
    rendered = render_prompt(template, request, bos_token="", eos_token="")
    # what Qwen3.5 writes after each prompt: thinking only when the prompt left a block open
    reasoning = "Need the weather tool.\n</think>\n\n" if rendered.starts_in_thinking else ""
    reply = (
        reasoning + "Checking.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
        "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>"
    )
    pipeline = OutputPipeline(rendered.traits, starts_in_thinking=rendered.starts_in_thinking, tools=TOOLS)

    out = comparable(feed_all(pipeline, list(reply)))

    thinking = [Delta("Need the weather tool.", "thinking")] if think is not False else []
    assert out == [*thinking, Delta("Checking."), call("get_weather", {"city": "Oslo", "days": 2}, 0)]


def test_feed_returns_merged_deltas_and_ignores_empty_text() -> None:
    pipeline = OutputPipeline(QWEN35, starts_in_thinking=True)

    assert pipeline.feed("") == []
    assert pipeline.feed("a</think>b") == [Delta("a", "thinking"), Delta("b")]
    assert pipeline.finish() == []


def test_finish_releases_held_text_in_order() -> None:
    pipeline = OutputPipeline(QWEN3, starts_in_thinking=False, tools=TOOLS)

    assert pipeline.feed("Answer <tool_") == [Delta("Answer")]
    assert pipeline.finish() == [Delta(" <tool_")]
