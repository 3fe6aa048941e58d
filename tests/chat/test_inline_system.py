"""System messages after the conversation has begun (Claude Code sends one after every user turn).

Kept as a system turn where the template renders one there; folded into the neighbouring user turn,
marked as a reminder, where the template refuses it (Qwen3.5) or leaves it out.
"""

from __future__ import annotations

import pytest

from kinfer.chat.inline_system import fold_inline_system
from kinfer.chat.template import render_prompt
from kinfer.protocol import ChatRequest, Message, ToolCall
from tests.chat.chat_helpers import load_template

SYSTEM = Message("system", "You are Claude Code.")
ASK = Message("user", "Say hi")
ENVIRONMENT = Message("system", "# Environment\nThe agent list.")
REMINDER = "<system-reminder>\n# Environment\nThe agent list.\n</system-reminder>"
# a template that prints only the first system message and drops the rest (MiniMax's do)
FIRST_SYSTEM_ONLY = (
    "{% for m in messages %}{% if m.role != 'system' or loop.first %}"
    "<|{{ m.role }}|>{{ m.content }}<|end|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def render(template: str, *messages: Message) -> str:
    request = ChatRequest(model="m", messages=messages)
    return render_prompt(template, request, bos_token="", eos_token="").text


@pytest.mark.parametrize("file", ["smollm2-135m-instruct.jinja", "qwen3-0.6b.jinja"])
def test_a_template_that_renders_any_role_keeps_it_as_a_system_turn_where_it_was(file: str):
    text = render(load_template(file), SYSTEM, ASK, ENVIRONMENT)
    assert text.endswith(
        "<|im_start|>user\nSay hi<|im_end|>\n"
        "<|im_start|>system\n# Environment\nThe agent list.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_a_template_that_refuses_it_gets_it_folded_into_the_user_turn_it_follows():
    # Qwen3.5's template raises "System message must be at the beginning."
    text = render(load_template("qwen3.5-4b.jinja"), SYSTEM, ASK, ENVIRONMENT)
    assert text.startswith("<|im_start|>system\nYou are Claude Code.<|im_end|>\n")
    assert f"<|im_start|>user\nSay hi\n\n{REMINDER}<|im_end|>\n<|im_start|>assistant\n" in text


def test_a_template_that_drops_it_gets_it_folded_too():
    text = render(FIRST_SYSTEM_ONLY, SYSTEM, ASK, ENVIRONMENT)
    assert text == f"<|system|>You are Claude Code.<|end|><|user|>Say hi\n\n{REMINDER}<|end|><|assistant|>"


# ---- where folded text goes -----------------------------------------------------------------------

CALL = ToolCall("call_1", "Bash", {"command": "ls"})


def test_after_an_assistant_turn_it_opens_the_next_user_turn():
    folded = fold_inline_system(
        (SYSTEM, ASK, Message("assistant", "Hi!"), ENVIRONMENT, Message("user", "More"))
    )
    assert folded[-1] == Message("user", f"{REMINDER}\n\nMore")
    assert folded[:3] == (SYSTEM, ASK, Message("assistant", "Hi!"))


def test_at_the_end_after_an_assistant_turn_it_becomes_a_user_turn():
    folded = fold_inline_system((SYSTEM, ASK, Message("assistant", "Hi!"), ENVIRONMENT))
    assert folded[-1] == Message("user", REMINDER)


def test_between_a_tool_call_and_its_result_it_waits_for_the_result():
    calling = Message("assistant", "", tool_calls=(CALL,))
    result = Message("tool", "a.txt", tool_call_id="call_1", name="Bash")
    folded = fold_inline_system((SYSTEM, ASK, calling, ENVIRONMENT, result, Message("assistant", "Done.")))
    assert [m.role for m in folded] == ["system", "user", "assistant", "tool", "assistant"]
    assert folded[3].content == f"a.txt\n\n{REMINDER}"


def test_system_messages_before_the_first_turn_join_the_system_prompt():
    folded = fold_inline_system((SYSTEM, Message("system", "Be brief."), ASK))
    assert folded == (Message("system", "You are Claude Code.\n\nBe brief."), ASK)


def test_text_already_marked_as_a_reminder_is_not_wrapped_twice():
    marked = Message("system", REMINDER)
    assert fold_inline_system((ASK, marked))[-1].content == f"Say hi\n\n{REMINDER}"
