"""Tool calls end to end in all four dialects, streaming and not, with thinking, and a second turn.

The scripted engine writes exactly what a model writes to call `get_weather` (Hermes JSON under
Qwen3's template, XML under Qwen3.5's), after a little thinking; once the tool's result is in the
prompt it answers. Everything between (template, think split, call parser, HTTP, SDKs) is real.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import anthropic
import ollama
import openai
import pytest

from tests.live_server import running_server, server_settings
from tests.scripted_engine import ScriptedEngine
from tests.server.dialect_helpers import (
    FINAL_ANSWER,
    HERMES_CALL,
    WEATHER_REPORT,
    WEATHER_SCHEMA,
    XML_CALL,
    Scripted,
    template,
    weather_then_answer,
)

QUESTION = "What's the weather in Paris?"
THOUGHT = "I need the weather."


@dataclass(frozen=True)
class Case:
    template: str
    call: str
    thinking: str  # how the model's thinking looks before the call
    rendered_call: str  # how the template writes the call back into the next prompt


CASES = {
    "hermes": Case(
        template("qwen3-0.6b.jinja"),
        HERMES_CALL,
        f"<think>\n{THOUGHT}\n</think>\n\n",
        HERMES_CALL,
    ),
    # Qwen3.5's template opens the think block itself, so the reply starts inside it
    "qwen3.5-xml": Case(
        template("qwen3.5-4b.jinja"),
        XML_CALL,
        f"{THOUGHT}\n</think>\n\n",
        "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>",
    ),
}
TOOL_RESPONSE = f"<tool_response>\n{WEATHER_REPORT}\n</tool_response>"


@pytest.fixture(scope="module", params=sorted(CASES))
def case_server(request, tmp_path_factory: pytest.TempPathFactory):
    case = CASES[request.param]
    home = tmp_path_factory.mktemp("kinfer-home")
    mp = pytest.MonkeyPatch()
    mp.setenv("OLLAMA_MODELS", str(home / "no-ollama"))
    prompts: list[str] = []
    reply = weather_then_answer(case.call, thinking=case.thinking)

    def recorded(prompt: str) -> str:
        prompts.append(prompt)
        return reply(prompt)

    factory = lambda model, settings, ctx: ScriptedEngine(reply=recorded, template=case.template)  # noqa: E731
    try:
        with running_server(server_settings(home), engine_factory=factory) as server:
            yield case, Scripted(server, prompts)
    finally:
        mp.undo()


def assert_second_prompt_replays_the_call(case: Case, server: Scripted) -> None:
    prompt = server.prompts[-1]
    assert case.rendered_call in prompt
    assert TOOL_RESPONSE in prompt
    assert prompt.index(case.rendered_call) < prompt.index(TOOL_RESPONSE)


# ---- OpenAI Chat Completions ------------------------------------------------------------------

OPENAI_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city.",
            "parameters": WEATHER_SCHEMA,
        },
    }
]


def openai_client(server: Scripted) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_openai_chat_returns_the_call_with_its_reasoning(case_server):
    _, server = case_server
    reply = openai_client(server).chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": QUESTION}], tools=OPENAI_TOOLS
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})
    assert choice.message.content is None
    assert choice.message.model_extra["reasoning_content"] == THOUGHT


def test_openai_chat_streams_the_call_as_one_indexed_delta(case_server):
    _, server = case_server
    chunks = list(
        openai_client(server).chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": QUESTION}], tools=OPENAI_TOOLS, stream=True
        )
    )
    deltas = [c.choices[0].delta for c in chunks]
    calls = [tc for d in deltas for tc in d.tool_calls or ()]
    assert len(calls) == 1 and calls[0].index == 0 and calls[0].id.startswith("call_")
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert "".join(d.model_extra.get("reasoning_content") or "" for d in deltas) == THOUGHT
    assert "".join(d.content or "" for d in deltas) == ""
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_openai_chat_second_turn_replays_the_call_and_result(case_server):
    case, server = case_server
    messages = [
        {"role": "user", "content": QUESTION},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": WEATHER_REPORT},
    ]
    reply = openai_client(server).chat.completions.create(
        model="smollm2", messages=messages, tools=OPENAI_TOOLS
    )
    assert reply.choices[0].message.content == FINAL_ANSWER
    assert reply.choices[0].finish_reason == "stop"
    assert_second_prompt_replays_the_call(case, server)


# ---- Ollama -----------------------------------------------------------------------------------


def ollama_client(server: Scripted) -> ollama.Client:
    return ollama.Client(host=server.url)


def test_ollama_chat_returns_the_call_with_object_arguments(case_server):
    _, server = case_server
    reply = ollama_client(server).chat(
        model="smollm2", messages=[{"role": "user", "content": QUESTION}], tools=OPENAI_TOOLS, stream=False
    )
    (call,) = reply.message.tool_calls
    assert (call.function.name, call.function.arguments) == ("get_weather", {"city": "Paris"})
    assert reply.message.thinking == THOUGHT
    assert reply.message.content == ""
    assert reply.done_reason == "stop"  # Ollama says stop even for tool calls


def test_ollama_chat_streams_the_call(case_server):
    _, server = case_server
    chunks = list(
        ollama_client(server).chat(
            model="smollm2", messages=[{"role": "user", "content": QUESTION}], tools=OPENAI_TOOLS, stream=True
        )
    )
    calls = [c for chunk in chunks for c in chunk.message.tool_calls or ()]
    assert [(c.function.name, c.function.arguments) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert "".join(chunk.message.thinking or "" for chunk in chunks) == THOUGHT
    assert chunks[-1].done


def test_ollama_chat_second_turn_replays_the_call_and_result(case_server):
    case, server = case_server
    messages = [
        {"role": "user", "content": QUESTION},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "tool_name": "get_weather", "content": WEATHER_REPORT},
    ]
    reply = ollama_client(server).chat(model="smollm2", messages=messages, tools=OPENAI_TOOLS, stream=False)
    assert reply.message.content == FINAL_ANSWER
    assert_second_prompt_replays_the_call(case, server)


# ---- Anthropic Messages -----------------------------------------------------------------------

ANTHROPIC_TOOLS = [
    {"name": "get_weather", "description": "Weather for a city.", "input_schema": WEATHER_SCHEMA}
]


def anthropic_client(server: Scripted) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


def test_anthropic_returns_thinking_then_a_tool_use_block(case_server):
    _, server = case_server
    reply = anthropic_client(server).messages.create(
        model="smollm2",
        max_tokens=512,
        messages=[{"role": "user", "content": QUESTION}],
        tools=ANTHROPIC_TOOLS,
    )
    assert [b.type for b in reply.content] == ["thinking", "tool_use"]
    thinking, use = reply.content
    assert thinking.thinking == THOUGHT
    assert use.id.startswith("toolu_")
    assert (use.name, use.input) == ("get_weather", {"city": "Paris"})
    assert reply.stop_reason == "tool_use"


def test_anthropic_streams_the_tool_use_as_input_json_delta(case_server):
    _, server = case_server
    with anthropic_client(server).messages.stream(
        model="smollm2",
        max_tokens=512,
        messages=[{"role": "user", "content": QUESTION}],
        tools=ANTHROPIC_TOOLS,
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    starts = [e.content_block for e in events if e.type == "content_block_start"]
    assert [b.type for b in starts] == ["thinking", "tool_use"]
    assert starts[1].input == {}  # the input arrives as JSON deltas, as Anthropic streams it
    partial = "".join(
        e.delta.partial_json
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    )
    assert json.loads(partial) == {"city": "Paris"}
    assert final.content[1].input == {"city": "Paris"}
    assert final.stop_reason == "tool_use"


def test_anthropic_second_turn_replays_the_call_and_result(case_server):
    case, server = case_server
    first = anthropic_client(server).messages.create(
        model="smollm2",
        max_tokens=512,
        messages=[{"role": "user", "content": QUESTION}],
        tools=ANTHROPIC_TOOLS,
    )
    use = first.content[1]
    messages = [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": WEATHER_REPORT}],
        },
    ]
    reply = anthropic_client(server).messages.create(
        model="smollm2", max_tokens=512, messages=messages, tools=ANTHROPIC_TOOLS
    )
    assert [b.type for b in reply.content] == ["thinking", "text"]
    assert reply.content[1].text == FINAL_ANSWER
    assert reply.stop_reason == "end_turn"
    assert_second_prompt_replays_the_call(case, server)


# ---- OpenAI Responses -------------------------------------------------------------------------

RESPONSES_TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": WEATHER_SCHEMA,
    }
]


def test_responses_returns_a_reasoning_item_then_a_function_call(case_server):
    _, server = case_server
    reply = openai_client(server).responses.create(model="smollm2", input=QUESTION, tools=RESPONSES_TOOLS)
    assert [item.type for item in reply.output] == ["reasoning", "function_call"]
    reasoning, call = reply.output
    assert reasoning.id.startswith("rs_") and reasoning.summary[0].text == THOUGHT
    assert call.id.startswith("fc_") and call.call_id.startswith("call_")
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
    assert reply.status == "completed"


def test_responses_streams_the_function_call_arguments(case_server):
    _, server = case_server
    with openai_client(server).responses.stream(
        model="smollm2", input=QUESTION, tools=RESPONSES_TOOLS
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and json.loads(done[0].arguments) == {"city": "Paris"}
    assert done[0].output_index == 1 and done[0].item_id == final.output[1].id
    assert final.output[1].call_id.startswith("call_")


def test_responses_second_turn_by_previous_response_id(case_server):
    case, server = case_server
    api = openai_client(server)
    first = api.responses.create(model="smollm2", input=QUESTION, tools=RESPONSES_TOOLS)
    call = first.output[1]
    second = api.responses.create(
        model="smollm2",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": WEATHER_REPORT}],
        tools=RESPONSES_TOOLS,
    )
    assert second.output_text == FINAL_ANSWER
    assert_second_prompt_replays_the_call(case, server)


def test_responses_second_turn_with_the_items_sent_back(case_server):
    case, server = case_server
    api = openai_client(server)
    first = api.responses.create(model="smollm2", input=QUESTION, tools=RESPONSES_TOOLS, store=False)
    call = first.output[1]
    history = [
        {"role": "user", "content": QUESTION},
        *[item.model_dump(exclude_none=True) for item in first.output],
    ]
    output = {"type": "function_call_output", "call_id": call.call_id, "output": WEATHER_REPORT}
    second = api.responses.create(model="smollm2", input=[*history, output], tools=RESPONSES_TOOLS)
    assert second.output_text == FINAL_ANSWER
    assert_second_prompt_replays_the_call(case, server)
