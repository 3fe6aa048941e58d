"""The streaming think splitter: thinking and answer come apart at the markers, wherever the stream is cut."""

from __future__ import annotations

import pytest

from kinfer.chat.thinking import ThinkSplitter
from kinfer.protocol import Delta
from tests.chat.chat_helpers import collapse, feed_all, splits


def thinking(text: str) -> Delta:
    return Delta(text, "thinking")


def answer(text: str) -> Delta:
    return Delta(text, "text")


# (reply as the model streams it, starts_in_thinking, what comes out)
CASES = [
    pytest.param(
        "<think>\nThe sky scatters blue light more.\n</think>\n\nRayleigh scattering.",
        False,
        [thinking("The sky scatters blue light more."), answer("Rayleigh scattering.")],
        id="model-opens-its-own-block",
    ),
    pytest.param(
        "The sky scatters blue light more.\n</think>\n\nRayleigh scattering.",
        True,
        [thinking("The sky scatters blue light more."), answer("Rayleigh scattering.")],
        id="prompt-opened-the-block",
    ),
    pytest.param(
        "<think>\nFirst.\n\nSecond.\n</think>\n\nDone.\n",
        True,
        [thinking("First.\n\nSecond."), answer("Done.\n")],
        id="prompt-opened-and-model-opens-again",
    ),
    pytest.param(
        "  \n<think>Short.</think>Answer",
        False,
        [thinking("Short."), answer("Answer")],
        id="whitespace-before-the-opener",
    ),
    pytest.param(
        "\n\nHello <b>there</b>, no thinking today.  ",
        False,
        [answer("\n\nHello <b>there</b>, no thinking today.  ")],
        id="no-block-text-untouched",
    ),
    pytest.param(
        "Answer first <think>then this</think> is just text",
        False,
        [answer("Answer first <think>then this</think> is just text")],
        id="opener-not-at-start-is-text",
    ),
    pytest.param(
        "<think>\nI was cut off while thi",
        False,
        [thinking("I was cut off while thi")],
        id="unterminated-thinking",
    ),
    pytest.param(
        "<think>\nWhat about </thi",
        False,
        [thinking("What about </thi")],
        id="partial-closer-at-the-end-is-thinking",
    ),
    pytest.param("<thi", False, [answer("<thi")], id="partial-opener-alone-is-text"),
    pytest.param(
        "<think>\n\n</think>\n\nJust the answer.",
        False,
        [answer("Just the answer.")],
        id="empty-block",
    ),
    pytest.param(
        "<think>a < b and c </ d</think>x",
        False,
        [thinking("a < b and c </ d"), answer("x")],
        id="marker-lookalikes-inside",
    ),
]


@pytest.mark.parametrize(("reply", "starts_in_thinking", "expected"), CASES)
def test_split_whole(reply: str, starts_in_thinking: bool, expected: list[Delta]) -> None:
    splitter = ThinkSplitter(starts_in_thinking=starts_in_thinking)

    assert collapse(feed_all(splitter, [reply])) == expected


@pytest.mark.parametrize(("reply", "starts_in_thinking", "expected"), CASES)
def test_split_at_every_position_gives_the_same_result(
    reply: str, starts_in_thinking: bool, expected: list[Delta]
) -> None:
    for chunks in splits(reply):
        splitter = ThinkSplitter(starts_in_thinking=starts_in_thinking)
        assert collapse(feed_all(splitter, chunks)) == expected, chunks


@pytest.mark.parametrize(
    ("reasoning", "reply_text"),
    [
        ("Blue light scatters more (Rayleigh).", "Because of Rayleigh scattering."),
        ("Tokyo: 東京 🙂\n\n  indented step\n- a list", "Done.\n\n```py\nprint('<think>')\n```\n"),
        ("x", "<tool_call>\n{}\n</tool_call>"),
    ],
)
def test_joined_output_is_the_input_minus_markers(reasoning: str, reply_text: str) -> None:
    reply = f"<think>\n{reasoning}\n</think>\n\n{reply_text}"
    for chunks in splits(reply):
        out = feed_all(ThinkSplitter(), chunks)

        assert "".join(d.text for d in out if d.kind == "thinking") == reasoning
        assert "".join(d.text for d in out if d.kind == "text") == reply_text


def test_a_reply_without_markers_comes_out_unchanged() -> None:
    reply = "  Plain answer with a < sign, a </b> tag and trailing space "
    for chunks in splits(reply):
        assert "".join(d.text for d in feed_all(ThinkSplitter(), chunks)) == reply


def test_thinking_streams_before_the_closer_arrives() -> None:
    splitter = ThinkSplitter()

    first = splitter.feed("<think>\nStep one")
    second = splitter.feed(", step two.\n")
    third = splitter.feed("</think>\n\nDone")

    assert first == [thinking("Step one")]
    # the newline is held: it may be the whitespace before </think>, which is trimmed
    assert second == [thinking(", step two.")]
    assert third == [answer("Done")]
    assert splitter.finish() == []


def test_answer_streams_as_it_comes() -> None:
    splitter = ThinkSplitter(starts_in_thinking=True)
    splitter.feed("ok</think>\n\n")

    assert splitter.feed("Hel") == [answer("Hel")]
    assert splitter.feed("lo") == [answer("lo")]


def test_in_thinking_reports_the_state() -> None:
    splitter = ThinkSplitter(starts_in_thinking=True)
    assert splitter.in_thinking

    splitter.feed("hmm</think>")
    assert not splitter.in_thinking


def test_other_markers() -> None:
    splitter = ThinkSplitter("<seed:think>", "</seed:think>")

    out = feed_all(splitter, ["<seed:think>plan</seed:", "think>answer"])

    assert collapse(out) == [thinking("plan"), answer("answer")]
