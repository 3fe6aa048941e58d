"""The dialect translators on their own: wire JSON in, the internal request out (no server, no model)."""

from __future__ import annotations

import pytest

from kinfer.errors import InvalidRequest
from kinfer.protocol import Message, ToolCall, ToolSpec
from kinfer.server.anthropic import MessageAssembler
from kinfer.server.anthropic_wire import MessagesBody
from kinfer.server.anthropic_wire import to_request as anthropic_request
from kinfer.server.responses_tools import to_tools
from kinfer.server.responses_wire import ResponsesBody
from kinfer.server.responses_wire import to_messages as responses_messages
from kinfer.server.wire import parse_wire

# ---- Anthropic --------------------------------------------------------------------------------


def anthropic(**fields) -> MessagesBody:
    return parse_wire(MessagesBody, {"model": "m", "max_tokens": 64, **fields})


def test_an_agent_turn_becomes_assistant_calls_and_named_tool_messages():
    body = anthropic(
        system=[
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.1.abc; cch=9f8e7;"},
            {"type": "text", "text": "You are a coder.", "cache_control": {"type": "ephemeral"}},
        ],
        messages=[
            {"role": "user", "content": "Read a.txt and b.txt"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Two reads.", "signature": "sig"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "text", "text": "Reading both."},
                    {"type": "tool_use", "id": "toolu_a", "name": "Read", "input": {"path": "a.txt"}},
                    {"type": "tool_use", "id": "toolu_b", "name": "Read", "input": {"path": "b.txt"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_a", "content": "alpha"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_b",
                        "content": [{"type": "text", "text": "no such file"}],
                        "is_error": True,
                    },
                    {"type": "text", "text": "<system-reminder>cwd is /w</system-reminder>"},
                    {"type": "text", "text": "Now compare them."},
                ],
            },
        ],
    )
    request = anthropic_request(body, "msg_1")
    assert request.messages == (
        Message("system", "x-anthropic-billing-header: cc_version=2.1.1.abc;\n\nYou are a coder."),
        Message("user", "Read a.txt and b.txt"),
        Message(
            "assistant",
            "Reading both.",
            thinking="Two reads.",
            tool_calls=(
                ToolCall("toolu_a", "Read", {"path": "a.txt"}),
                ToolCall("toolu_b", "Read", {"path": "b.txt"}),
            ),
        ),
        Message("tool", "alpha", tool_call_id="toolu_a", name="Read"),
        Message("tool", "Error: no such file", tool_call_id="toolu_b", name="Read"),
        Message("user", "<system-reminder>cwd is /w</system-reminder>\n\nNow compare them."),
    )
    assert request.dialect == "anthropic" and request.max_tokens == 64 and request.stop == ()


def test_tools_and_tool_choice_map_to_the_internal_names():
    tools = [
        {"name": "get_time", "description": "Now.", "input_schema": {"type": "object"}},
        {"type": "web_search_20250305", "name": "web_search"},
    ]
    expected = (ToolSpec("get_time", "Now.", {"type": "object"}),)
    hello = [{"role": "user", "content": "hi"}]
    for choice, name in [
        ({"type": "auto"}, "auto"),
        ({"type": "any"}, "required"),
        ({"type": "tool", "name": "get_time"}, "get_time"),
    ]:
        request = anthropic_request(anthropic(messages=hello, tools=tools, tool_choice=choice), "m")
        assert (request.tools, request.tool_choice) == (expected, name)
    none = anthropic_request(anthropic(messages=hello, tools=tools, tool_choice={"type": "none"}), "m")
    assert (none.tools, none.tool_choice) == ((), "none")


@pytest.mark.parametrize(
    ("thinking", "effort", "think", "level"),
    [
        (None, None, None, None),
        ({"type": "enabled", "budget_tokens": 2048}, None, True, None),
        ({"type": "disabled"}, "high", False, None),
        ({"type": "adaptive"}, "max", None, "high"),
        ({"type": "enabled", "budget_tokens": 2048}, "low", True, "low"),
    ],
)
def test_thinking_and_effort_map_to_think_mode(thinking, effort, think, level):
    fields = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4096}
    if thinking:
        fields["thinking"] = thinking
    if effort:
        fields["output_config"] = {"effort": effort}
    request = anthropic_request(anthropic(**fields), "m")
    assert (request.think, request.think_level) == (think, level)


def test_stop_sequences_become_the_requests_stop_strings():
    body = anthropic(messages=[{"role": "user", "content": "hi"}], stop_sequences=["END", "", "STOP"])
    assert anthropic_request(body, "m").stop == ("END", "STOP")


def test_the_assembler_groups_deltas_into_blocks_and_signs_thinking():
    from kinfer.protocol import Delta, ToolCallEvent

    assembler = MessageAssembler()
    for event in (
        Delta("Let me ", "thinking"),
        Delta("see.", "thinking"),
        Delta("Calling."),
        ToolCallEvent(ToolCall("call_abc", "Read", {"path": "a"}), 0),
    ):
        assembler.feed(event)
    assembler.finish()
    thinking, text, use = assembler.content
    assert thinking["thinking"] == "Let me see." and thinking["signature"].startswith("kinfer-")
    assert text == {"type": "text", "text": "Calling."}
    assert use == {"type": "tool_use", "id": "toolu_abc", "name": "Read", "input": {"path": "a"}}


# ---- Responses --------------------------------------------------------------------------------


def test_output_items_sent_back_fold_into_one_assistant_turn():
    body = parse_wire(
        ResponsesBody,
        {
            "input": [
                {"role": "developer", "content": "Be terse."},
                {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris and Rome?"}]},
                {
                    "type": "reasoning",
                    "id": "rs_1",
                    "summary": [{"type": "summary_text", "text": "Two calls."}],
                },
                {
                    "type": "function_call",
                    "call_id": "call_p",
                    "name": "weather",
                    "arguments": '{"city":"Paris"}',
                },
                {
                    "type": "function_call",
                    "call_id": "call_r",
                    "name": "weather",
                    "arguments": '{"city":"Rome"}',
                },
                {"type": "function_call_output", "call_id": "call_p", "output": "sunny"},
                {"type": "function_call_output", "call_id": "call_r", "output": "rain"},
                {"type": "web_search_call", "id": "ws_1"},
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "Paris sunny, Rome rain."}],
                },
                {"role": "user", "content": "Thanks"},
            ]
        },
    )
    assert responses_messages(body.input, {}) == [
        Message("system", "Be terse."),
        Message("user", "Weather in Paris and Rome?"),
        Message(
            "assistant",
            "",
            thinking="Two calls.",
            tool_calls=(
                ToolCall("call_p", "weather", {"city": "Paris"}),
                ToolCall("call_r", "weather", {"city": "Rome"}),
            ),
        ),
        Message("tool", "sunny", tool_call_id="call_p", name="weather"),
        Message("tool", "rain", tool_call_id="call_r", name="weather"),
        Message("assistant", "Paris sunny, Rome rain."),
        Message("user", "Thanks"),
    ]


def test_a_call_output_for_an_earlier_response_is_named_from_the_history():
    body = parse_wire(
        ResponsesBody, {"input": [{"type": "function_call_output", "call_id": "call_x", "output": "42"}]}
    )
    assert responses_messages(body.input, {"call_x": "answer"}) == [
        Message("tool", "42", tool_call_id="call_x", name="answer")
    ]


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ({"type": "item_reference", "id": "msg_1"}, "item_reference"),
        ({"type": "function_call", "call_id": "c", "name": "f", "arguments": "{oops"}, "not valid JSON"),
        ({"role": "tool", "content": "x"}, "role"),
    ],
)
def test_items_we_cannot_serve_are_a_400(item, message):
    body = parse_wire(ResponsesBody, {"input": [item]})
    with pytest.raises(InvalidRequest, match=message):
        responses_messages(body.input, {})


def test_namespace_tools_become_flat_named_functions_that_split_back():
    body = parse_wire(
        ResponsesBody,
        {
            "tools": [
                {"type": "function", "name": "shell", "parameters": {"type": "object"}},
                {
                    "type": "namespace",
                    "name": "mcp__docs__",
                    "tools": [{"type": "function", "name": "search"}],
                },
                {"type": "namespace", "name": "mcp__web", "tools": [{"type": "function", "name": "search"}]},
                {"type": "namespace", "name": "mcp__fs", "tools": [{"type": "function", "name": "_read"}]},
                {"type": "web_search"},
            ]
        },
    )
    tools = to_tools(body.tools)

    assert [t.name for t in tools.specs] == [
        "shell",
        "mcp__docs__search",
        "mcp__web__search",
        "mcp__fs__read",
    ]
    assert tools.dropped == ("web_search",)
    assert tools.split("mcp__docs__search") == ("mcp__docs__", "search")
    assert tools.split("shell") == (None, "shell")
    assert tools.split("read") == ("mcp__fs", "_read")  # the inner name alone, where it is unique
    assert tools.split("search") == (None, "search")  # two namespaces have it: left as written
    replayed = parse_wire(
        ResponsesBody,
        {"input": [{"type": "function_call", "namespace": "mcp__docs__", "name": "search", "call_id": "c"}]},
    )
    (message,) = responses_messages(replayed.input, {})
    assert message.tool_calls == (ToolCall("c", "mcp__docs__search", {}),)


def test_a_hosted_tool_is_dropped_with_one_warning_per_dialect_and_type(caplog, monkeypatch) -> None:
    # an agent sends the same hosted tools every turn: the operator hears of each kind once
    from kinfer.server import openai_wire, wire

    monkeypatch.setattr(wire, "_dropped_tools_warned", set())
    anthropic_body = {
        "model": "m",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [
            {"type": "web_search_20250305", "name": "web_search"},
            {"name": "Bash", "input_schema": {"type": "object"}},
        ],
    }
    openai_tools = [openai_wire.WireTool(type="web_search_preview")]
    with caplog.at_level("INFO", logger="kinfer.server.wire"):
        for _ in range(3):
            request = anthropic_request(parse_wire(MessagesBody, anthropic_body), "msg_1")
            assert [t.name for t in request.tools] == ["Bash"]
            assert openai_wire.to_tools(openai_tools) == ()
    warned = [r.getMessage() for r in caplog.records if "dropping" in r.getMessage()]
    assert len(warned) == 2
    assert "'web_search_20250305'" in warned[0] and warned[0].startswith("anthropic")
    assert "'web_search_preview'" in warned[1] and warned[1].startswith("openai")
