"""Fitting a prompt into a row, on the engine thread where its length in tokens is known.

A prompt that does not fit is refused with the numbers and what sets the limit, or, when the request
asks for truncation, rendered again without its oldest messages: system messages stay, a tool result
keeps its call, the newest message always stays. Tokens here are characters (the scripted engine's).
"""

from __future__ import annotations

import pytest

from kinfer.chat.template import CHATML_TEMPLATE
from kinfer.engines.base import ModelInfo
from kinfer.errors import PromptTooLong
from kinfer.protocol import ChatRequest, Message, ToolCall
from kinfer.scheduler.prepare import prepare_job

SYSTEM = Message("system", "Be brief.")
OLD_TURNS = (
    Message("user", "first question " * 10),
    Message("assistant", "first answer " * 10),
    Message("user", "second question " * 10),
    Message("assistant", "second answer " * 10),
)
NEWEST = Message("user", "third question")


def model(ctx: int, trained: int = 0) -> ModelInfo:
    return ModelInfo(
        name="tiny",
        engine="scripted",
        architecture="scripted",
        chat_template=CHATML_TEMPLATE,  # it renders tool calls and results
        bos_token="",
        eos_token="<|im_end|>",
        context_length=ctx,
        rows=1,
        train_context_length=trained,
    )


def prepare(info: ModelInfo, *messages: Message, **fields):
    request = ChatRequest(model="tiny", messages=messages, **fields)
    return prepare_job(info, lambda text: [ord(c) for c in text], request, "job")


def prompt_of(prepared) -> str:
    return "".join(chr(t) for t in prepared.job.prompt)


def test_a_prompt_that_fits_is_kept_whole_and_the_reply_gets_the_rest_of_the_row():
    prepared = prepare(model(1000), SYSTEM, *OLD_TURNS, NEWEST, truncation="drop_oldest")
    assert "first question" in prompt_of(prepared)
    assert prepared.job.max_tokens == 1000 - prepared.prompt_tokens


def test_refused_with_its_length_the_limit_and_what_sets_it():
    with pytest.raises(PromptTooLong) as refused:
        prepare(model(300, trained=8192), SYSTEM, *OLD_TURNS, NEWEST)
    error = refused.value
    assert error.limit == 300 and error.prompt_tokens > 300
    assert error.code == "context_length_exceeded" and error.status == 400
    assert "holds 300 tokens" in error.why and "up to 8192" in error.why  # a larger --ctx would help


def test_at_the_trained_context_it_says_a_larger_ctx_would_not_help():
    with pytest.raises(PromptTooLong) as refused:
        prepare(model(300, trained=300), SYSTEM, *OLD_TURNS, NEWEST)
    assert "would not help" in refused.value.why and "restart" not in refused.value.why


def test_drop_oldest_keeps_the_system_message_and_the_newest_turns():
    prepared = prepare(model(300), SYSTEM, *OLD_TURNS, NEWEST, truncation="drop_oldest")
    prompt = prompt_of(prepared)
    assert prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    assert "third question" in prompt and "first question" not in prompt
    assert prepared.prompt_tokens < 300
    # it drops no more than it must: the newest exchange before the question still fits
    assert "second answer" in prompt


CALL = Message("assistant", "", tool_calls=(ToolCall("call_1", "Bash", {"command": "ls"}),))
RESULT = Message("tool", "a.txt b.txt", tool_call_id="call_1", name="Bash")
AGENT_TURNS = (Message("user", "list the files " * 20), CALL, RESULT, Message("assistant", "Two files."))


@pytest.mark.parametrize(
    ("ctx", "kept"), [(400, True), (300, False)], ids=["room-for-both", "room-for-neither"]
)
def test_drop_oldest_keeps_a_tool_result_only_with_its_call(ctx: int, kept: bool):
    prepared = prepare(model(ctx), SYSTEM, *AGENT_TURNS, NEWEST, truncation="drop_oldest")
    prompt = prompt_of(prepared)
    assert "list the files" not in prompt and prompt.endswith(
        "third question<|im_end|>\n<|im_start|>assistant\n"
    )
    assert ('"name": "Bash"' in prompt) is kept
    assert ("a.txt b.txt" in prompt) is kept


def test_when_even_the_newest_turn_cannot_fit_it_is_still_refused():
    with pytest.raises(PromptTooLong, match="even without its oldest messages"):
        prepare(model(100), SYSTEM, *OLD_TURNS, Message("user", "huge " * 100), truncation="drop_oldest")


def test_a_raw_prompt_is_never_cut():
    with pytest.raises(PromptTooLong) as refused:
        prepare(model(50), raw_prompt="word " * 40, truncation="drop_oldest")
    assert refused.value.raw_prompt
