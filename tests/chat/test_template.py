"""Rendering prompts with real chat templates.

Same text as transformers, the right message shapes, ChatML when the model has none, raw prompts
untouched, and prefix-cache checkpoints that really are prefixes.
"""

from __future__ import annotations

import json

import pytest

from kinfer.chat.default_tools import with_default_tool_prompt
from kinfer.chat.jinja_env import render_template
from kinfer.chat.template import CHATML_TEMPLATE, message_to_hf, render_prompt, tool_to_hf
from kinfer.chat.traits import TemplateTraits, analyze_template
from kinfer.errors import InvalidRequest
from kinfer.protocol import ChatRequest, Message, ToolCall
from tests.chat.chat_helpers import CONVERSATION, TEMPLATE_FILES, TOOLS, WEATHER, load_template

HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 1}}\n</tool_call>'


def request(messages=CONVERSATION, **kwargs) -> ChatRequest:
    return ChatRequest(model="test", messages=tuple(messages), **kwargs)


def render(template: str | None, req: ChatRequest):
    return render_prompt(template, req, bos_token="<s>", eos_token="</s>")


# ---- same text as transformers' apply_chat_template ------------------------------------------------


@pytest.mark.parametrize("with_tools", [False, True], ids=["no-tools", "tools"])
@pytest.mark.parametrize("file", sorted(TEMPLATE_FILES))
def test_renders_exactly_what_transformers_renders(file: str, with_tools: bool) -> None:
    chat_template_utils = pytest.importorskip("transformers.utils.chat_template_utils")
    template = load_template(file)
    req = request(tools=TOOLS if with_tools else ())
    tools = [tool_to_hf(t) for t in TOOLS] if with_tools else []
    conversation = CONVERSATION
    if analyze_template(template).tool_format == "default":
        # a template without tool support renders kinfer's rewritten conversation, tools inside it
        conversation, tools = with_default_tool_prompt(CONVERSATION, tools), []

    ours = render(template, req).text

    theirs = chat_template_utils.render_jinja_template(
        conversations=[[message_to_hf(m) for m in conversation]],
        tools=tools or None,
        chat_template=template,
        add_generation_prompt=True,
        bos_token="<s>",
        eos_token="</s>",
    )[0][0]
    assert ours == theirs


def test_qwen3_single_turn_is_plain_chatml(qwen3_template: str) -> None:
    req = request([Message("system", "Be brief."), Message("user", "Hi!")])

    rendered = render(qwen3_template, req)

    assert rendered.text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    )
    assert rendered.starts_in_thinking is False


def test_multi_turn_history_replays_tool_calls_and_results_in_hermes_form(qwen3_template: str) -> None:
    text = render(qwen3_template, request(tools=TOOLS)).text

    # the tool list, as the template prints each OpenAI-style tool with tojson
    assert json.dumps(tool_to_hf(WEATHER), ensure_ascii=False) in text
    # the earlier call and its result
    assert HERMES_CALL + "<|im_end|>" in text
    assert '<|im_start|>user\n<tool_response>\n{"temperature": 21, "sky": "clear"}\n</tool_response>' in text
    # the older answer is replayed, the new question closes the prompt
    assert "It is 21 °C and clear in Paris.<|im_end|>" in text
    assert text.endswith("<|im_start|>user\nAnd in Tokyo?<|im_end|>\n<|im_start|>assistant\n")


def test_qwen35_replays_tool_calls_as_xml_with_thinking_kept(qwen35_template: str) -> None:
    text = render(qwen35_template, request(tools=TOOLS)).text

    assert (
        "<|im_start|>assistant\n<think>\nThe user wants the weather. I should call get_weather.\n</think>\n\n"
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n1\n</parameter>\n</function>\n</tool_call><|im_end|>"
    ) in text
    assert "<tools>\n" + json.dumps(tool_to_hf(WEATHER), ensure_ascii=False) in text


def test_llama32_puts_tools_in_the_first_user_message_and_calls_as_json() -> None:
    template = load_template("llama-3.2-3b-instruct.jinja")

    text = render(template, request(tools=TOOLS)).text

    assert text.startswith("<s><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n")
    assert "Given the following functions" in text
    assert '{"name": "get_weather", "parameters": {"city": "Paris", "days": 1}}<|eot_id|>' in text
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_smollm2_template_adds_its_default_system_line() -> None:
    template = load_template("smollm2-135m-instruct.jinja")

    text = render(template, request([Message("user", "Hello")])).text

    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.slow
def test_smollm2_fixture_is_the_template_inside_the_real_gguf(smollm2_gguf) -> None:
    from gguf import GGUFReader

    field = GGUFReader(smollm2_gguf).fields["tokenizer.chat_template"]
    in_gguf = bytes(field.parts[field.data[0]]).decode("utf-8")

    assert in_gguf == load_template("smollm2-135m-instruct.jinja")


# ---- message shapes --------------------------------------------------------------------------------

PROBE = "{{ messages | tojson }}|{{ tools | tojson }}"


def test_messages_reach_the_template_in_hugging_face_shape() -> None:
    text = render(PROBE, request(tools=(WEATHER,))).text
    messages_json, tools_json = text.split("|")
    messages = json.loads(messages_json)

    assert messages[0] == {"role": "system", "content": "You are a terse assistant."}
    call_turn = messages[2]
    assert call_turn["reasoning_content"] == "The user wants the weather. I should call get_weather."
    # both shapes: tool_call.function.* (OpenAI) and tool_call.name / .arguments (flat); arguments a dict
    assert call_turn["tool_calls"] == [
        {
            "id": "call_0001",
            "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 1}},
            "name": "get_weather",
            "arguments": {"city": "Paris", "days": 1},
        }
    ]
    assert messages[3] == {
        "role": "tool",
        "content": '{"temperature": 21, "sky": "clear"}',
        "tool_call_id": "call_0001",
        "name": "get_weather",
    }
    # keys without a value are absent, so `'tool_calls' in message` and `is defined` tests work
    assert "tool_calls" not in messages[1] and "reasoning_content" not in messages[1]
    assert json.loads(tools_json) == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Get the current weather for a city.",
                "parameters": WEATHER.parameters,
            },
        }
    ]


def test_tools_is_none_when_the_request_has_none() -> None:
    assert render("{{ tools is none }}", request()).text == "True"


def test_bos_and_eos_tokens_and_strftime_now_are_available() -> None:
    text = render("{{ bos_token }}{{ eos_token }}{{ strftime_now('%Y') | length }}", request()).text

    assert text == "<s></s>4"


def test_raw_prompt_is_used_verbatim(qwen3_template: str) -> None:
    raw = "Once upon a time, <|im_start|> {{ not a template }}"

    rendered = render(qwen3_template, request(raw_prompt=raw))

    assert rendered.text == raw
    assert rendered.checkpoints == ()


# ---- ChatML fallback -------------------------------------------------------------------------------


def test_chatml_is_the_fallback_when_the_model_has_no_template() -> None:
    req = request([Message("system", "Be brief."), Message("user", "Hi"), Message("assistant", "Hello!")])

    rendered = render(None, req)

    assert rendered.text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>assistant\n"
    )
    assert rendered.traits == analyze_template(None) == TemplateTraits(tool_format="default")


def test_chatml_fallback_teaches_and_replays_hermes_tool_calls() -> None:
    text = render(None, request(tools=(WEATHER,))).text

    assert text.startswith("<|im_start|>system\nYou are a terse assistant.\n\n# Tools\n")
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 1}}\n</tool_call>'
        in text
    )
    assert "<tool_response>\n" in text
    assert analyze_template(CHATML_TEMPLATE).tool_format == "default"


# ---- traits ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("file", "thinking", "switch", "tool_format"),
    [
        ("qwen3-0.6b.jinja", True, True, "hermes"),
        ("qwen3-4b-thinking-2507.jinja", True, False, "hermes"),
        ("qwen3.5-4b.jinja", True, True, "qwen3_5_xml"),
        ("qwen3-coder.jinja", False, False, "qwen3_5_xml"),
        ("llama-3.2-3b-instruct.jinja", False, False, "none"),
        ("smollm2-135m-instruct.jinja", False, False, "default"),
    ],
)
def test_analyze_template_reads_think_support_and_tool_format(
    file: str, thinking: bool, switch: bool, tool_format: str
) -> None:
    traits = analyze_template(load_template(file))

    assert (traits.supports_thinking, traits.has_think_switch, traits.tool_format) == (
        thinking,
        switch,
        tool_format,
    )
    assert (traits.think_open, traits.think_close) == ("<think>", "</think>")


# ---- prefix-cache checkpoints ----------------------------------------------------------------------


@pytest.mark.parametrize("with_tools", [False, True], ids=["no-tools", "tools"])
@pytest.mark.parametrize("file", sorted(TEMPLATE_FILES))
def test_checkpoints_are_exact_prefixes_of_the_prompt(file: str, with_tools: bool) -> None:
    template = load_template(file)
    tools = TOOLS if with_tools else ()
    rendered = render(template, request(tools=tools))
    first_turn = render(template, request(CONVERSATION[:2], tools=tools))

    assert rendered.checkpoints, "every template here keeps at least the system prompt"
    assert list(rendered.checkpoints) == sorted(set(rendered.checkpoints))
    assert all(0 < offset < len(rendered.text) for offset in rendered.checkpoints)
    # the first one covers the system prompt, and the first turn's prompt started the same way
    system_end = rendered.checkpoints[0]
    assert "terse assistant." in rendered.text[:system_end]
    assert first_turn.text[:system_end] == rendered.text[:system_end]
    # a later one is where the conversation before the newest question ends, rendered on its own
    before_question = render_without_generation_prompt(template, CONVERSATION[:-1], with_tools)
    for offset in rendered.checkpoints[1:]:
        assert rendered.text[:offset] == before_question


def test_a_template_that_refuses_a_system_only_render_is_probed(qwen35_template: str) -> None:
    # Qwen3.5 raises "No user query found in messages." for the system prompt alone
    assert render_without_generation_prompt(qwen35_template, CONVERSATION[:1], True) is None

    rendered = render(qwen35_template, request(tools=TOOLS))

    system_end = rendered.checkpoints[0]
    assert rendered.text[:system_end].endswith("You are a terse assistant.<|im_end|>\n<|im_start|>user\n")


def render_without_generation_prompt(template: str, messages, with_tools: bool) -> str | None:
    tools = [tool_to_hf(t) for t in TOOLS] if with_tools else []
    if analyze_template(template).tool_format == "default":
        messages, tools = with_default_tool_prompt(tuple(messages), tools), []
    variables = {
        "messages": [message_to_hf(m) for m in messages],
        "tools": tools or None,
        "documents": None,
        "bos_token": "<s>",
        "eos_token": "</s>",
        "add_generation_prompt": False,
    }
    try:
        return render_template(template, variables)
    except InvalidRequest:
        return None  # Qwen3.5 refuses a conversation with no user turn


def test_smollm2_checkpoints_mark_the_system_prompt_and_the_turn_before_the_new_question() -> None:
    template = load_template("smollm2-135m-instruct.jinja")

    rendered = render(template, request())

    system_end, history_end = rendered.checkpoints
    assert rendered.text[:system_end].endswith("You are a terse assistant.<|im_end|>\n")
    assert rendered.text[:history_end].endswith("It is 21 °C and clear in Paris.<|im_end|>\n")
    assert rendered.text[history_end:].startswith("<|im_start|>user\nAnd in Tokyo?")


def test_checkpoint_is_dropped_when_the_template_rewrites_history(qwen3_template: str) -> None:
    # Qwen3 shows a turn's thinking only while it is the latest turn, so the conversation cut before
    # the new question renders differently from the same turns inside the full prompt.
    rendered = render(qwen3_template, request())

    assert len(rendered.checkpoints) == 1
    assert rendered.text[: rendered.checkpoints[0]].endswith("You are a terse assistant.<|im_end|>\n")


def test_system_checkpoint_holds_across_turns(qwen3_template: str) -> None:
    first = render(qwen3_template, request(CONVERSATION[:2], tools=TOOLS))
    later = render(qwen3_template, request(CONVERSATION, tools=TOOLS))

    cut = first.checkpoints[0]
    assert later.text[:cut] == first.text[:cut]
    assert "</tools>" in first.text[:cut]


def test_tool_call_arguments_given_as_tool_call_objects_render_in_every_format() -> None:
    call = ToolCall("call_x", "search", {"query": "kinfer", "filters": {"lang": "en"}, "limit": 3})
    req = request([Message("user", "find it"), Message("assistant", "", tool_calls=(call,))], tools=TOOLS)

    coder = render(load_template("qwen3-coder.jinja"), req).text

    assert "<function=search>\n<parameter=query>\nkinfer\n</parameter>\n" in coder
    assert "<parameter=limit>\n3\n</parameter>" in coder
