"""Think mode as Ollama renders it: absent -> the template's default, asked -> the prompt ends in the
think opener, refused -> the empty think block; and whether the reply starts inside a think block."""

from __future__ import annotations

import pytest

from kinfer.chat.template import render_prompt
from kinfer.protocol import ChatRequest, Message
from tests.chat.chat_helpers import load_template

QUESTION = (Message("user", "Why is the sky blue?"),)
GENERATION_PROMPT = "<|im_start|>user\nWhy is the sky blue?<|im_end|>\n<|im_start|>assistant\n"
EMPTY_THINK = "<think>\n\n</think>\n\n"


def render(template: str | None, **kwargs):
    req = ChatRequest(model="test", messages=kwargs.pop("messages", QUESTION), **kwargs)
    return render_prompt(template, req, bos_token="", eos_token="")


# ---- Qwen3: a template with the enable_thinking switch and no opener of its own -----------------------


def test_qwen3_think_absent_is_the_template_default(qwen3_template: str) -> None:
    rendered = render(qwen3_template)

    assert rendered.text.endswith(GENERATION_PROMPT)
    # the model opens its own <think> block; the splitter catches it at the start of the reply
    assert rendered.starts_in_thinking is False


def test_qwen3_think_true_ends_the_prompt_with_the_opener(qwen3_template: str) -> None:
    rendered = render(qwen3_template, think=True)

    assert rendered.text.endswith(GENERATION_PROMPT + "<think>\n")
    assert rendered.starts_in_thinking is True


def test_qwen3_think_false_renders_the_empty_think_block(qwen3_template: str) -> None:
    rendered = render(qwen3_template, think=False)

    assert rendered.text.endswith(GENERATION_PROMPT + EMPTY_THINK)
    assert rendered.text.count("<think>") == 1, "the template's own block, not a second one"
    assert rendered.starts_in_thinking is False


def test_think_level_asks_for_thinking_and_passes_reasoning_effort(qwen3_template: str) -> None:
    rendered = render(qwen3_template, think_level="high")
    probe = render("{{ enable_thinking }} {{ reasoning_effort }}", think_level="high")

    assert rendered.text.endswith("<think>\n") and rendered.starts_in_thinking
    assert probe.text == "True high"


def test_enable_thinking_is_undefined_unless_the_request_sets_think() -> None:
    probe = "{{ enable_thinking is defined }} {{ reasoning_effort is defined }}"

    assert render(probe).text == "False False"
    assert render(probe, think=True).text == "True False"
    assert render(probe, think=False).text == "True False"


# ---- Qwen3.5: opens <think> by default, closes it empty when switched off ------------------------------


def test_qwen35_opens_the_think_block_by_default(qwen35_template: str) -> None:
    rendered = render(qwen35_template)

    assert rendered.text.endswith(GENERATION_PROMPT + "<think>\n")
    assert rendered.starts_in_thinking is True


def test_qwen35_think_true_does_not_open_a_second_block(qwen35_template: str) -> None:
    rendered = render(qwen35_template, think=True)

    assert rendered.text.endswith(GENERATION_PROMPT + "<think>\n")
    assert rendered.text.count("<think>") == 1


def test_qwen35_think_false(qwen35_template: str) -> None:
    rendered = render(qwen35_template, think=False)

    assert rendered.text.endswith(GENERATION_PROMPT + EMPTY_THINK)
    assert rendered.starts_in_thinking is False


# ---- templates with thinking but no switch --------------------------------------------------------------


def test_think_false_closes_the_block_a_switchless_template_always_opens() -> None:
    template = load_template("qwen3-4b-thinking-2507.jinja")

    default = render(template)
    refused = render(template, think=False)

    assert default.text.endswith(GENERATION_PROMPT + "<think>\n") and default.starts_in_thinking
    assert refused.text.endswith(GENERATION_PROMPT + EMPTY_THINK)
    assert refused.starts_in_thinking is False


def test_think_false_appends_the_empty_block_when_the_template_has_no_switch() -> None:
    # DeepSeek-R1-distill style: the template knows </think> (it strips old reasoning) but has no switch
    template = (
        "{% for m in messages %}<|{{ m.role }}|>{{ m.content.split('</think>')[-1] }}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
        "{# models answer with <think> ... </think> #}"
    )

    rendered = render(template, think=False)

    assert rendered.text == "<|user|>Why is the sky blue?<|assistant|>" + EMPTY_THINK


@pytest.mark.parametrize("think", [True, False, None])
def test_a_template_without_thinking_ignores_think(think: bool | None) -> None:
    template = load_template("smollm2-135m-instruct.jinja")

    rendered = render(template, think=think)

    assert rendered.text.endswith(GENERATION_PROMPT)
    assert "<think>" not in rendered.text
    assert rendered.starts_in_thinking is False


def test_a_quoted_think_tag_in_history_does_not_flip_the_mode(qwen3_template: str) -> None:
    messages = (
        Message("user", "What does the <think> tag do?"),
        Message("assistant", "It opens a reasoning block."),
        Message("user", "Thanks."),
    )

    rendered = render(qwen3_template, messages=messages)

    assert rendered.starts_in_thinking is False


def test_raw_prompt_ending_in_an_opener_starts_in_thinking(qwen3_template: str) -> None:
    rendered = render(qwen3_template, raw_prompt="<|im_start|>assistant\n<think>\n")

    assert rendered.starts_in_thinking is True
