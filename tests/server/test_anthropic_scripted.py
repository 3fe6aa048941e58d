"""Anthropic Messages where the exact reply matters: the scripted engine writes it, the rest is real."""

from __future__ import annotations

import anthropic
import httpx

from tests.server.dialect_helpers import read_sse, template

QWEN3 = template("qwen3-0.6b.jinja")
HELLO = [{"role": "user", "content": "Say hello."}]


def client(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)


def test_the_stream_has_anthropics_exact_event_sequence(scripted):
    with scripted(lambda prompt: "<think>\nHm.\n</think>\n\nHi!", QWEN3) as s:
        body = {"model": "smollm2", "max_tokens": 64, "stream": True, "messages": HELLO}
        response = httpx.post(s.url + "/v1/messages?beta=true", json=body, headers={"x-api-key": "k"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = read_sse(response.text)
    assert all(name == data["type"] for name, data in events)  # `event:` always names the data's type

    def describe(data: dict) -> str:
        if data["type"] == "content_block_start":
            return f"start {data['index']} {data['content_block']['type']}"
        if data["type"] == "content_block_delta":
            return f"delta {data['index']} {data['delta']['type']}"
        if data["type"] == "content_block_stop":
            return f"stop {data['index']}"
        return data["type"]

    shape = [describe(data) for _, data in events]
    # a delta per engine step ("Hm." is 3 characters, "Hi!" is 3; the scripted engine writes one a step),
    # or fewer: steps that finish before the stream is written go out as one delta (seen on a busy CI)
    deltas = {kind: shape.count(kind) for kind in ("delta 0 thinking_delta", "delta 1 text_delta")}
    assert all(1 <= n <= 3 for n in deltas.values()), deltas
    assert shape == [
        "message_start",
        "ping",
        "start 0 thinking",
        *["delta 0 thinking_delta"] * deltas["delta 0 thinking_delta"],
        "delta 0 signature_delta",
        "stop 0",
        "start 1 text",
        *["delta 1 text_delta"] * deltas["delta 1 text_delta"],
        "stop 1",
        "message_delta",
        "message_stop",
    ]
    start = events[0][1]["message"]
    assert start["id"].startswith("msg_") and start["role"] == "assistant" and start["content"] == []
    assert start["usage"]["output_tokens"] == 0
    final = events[-2][1]
    assert final["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert final["usage"]["output_tokens"] == len("<think>\nHm.\n</think>\n\nHi!")  # a token a character
    deltas_sent = [d["delta"] for _, d in events if d["type"] == "content_block_delta"]
    assert "".join(d.get("text", "") for d in deltas_sent) == "Hi!"
    assert "".join(d.get("thinking", "") for d in deltas_sent).strip() == "Hm."


def test_the_sdk_stream_gives_text_and_the_final_message(scripted):
    with (
        scripted(lambda prompt: "<think>\nHm.\n</think>\n\nHello there.", QWEN3) as s,
        client(s.url).messages.stream(model="smollm2", max_tokens=64, messages=HELLO) as stream,
    ):
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Hello there."
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == "Hm." and final.content[0].signature
    assert final.content[1].text == "Hello there."
    assert final.stop_reason == "end_turn"


def test_a_stop_sequence_ends_the_reply_and_is_reported(scripted):
    with scripted(lambda prompt: "Counting: one two STOP three END four") as s:
        api = client(s.url)
        reply = api.messages.create(
            model="smollm2", max_tokens=100, messages=HELLO, stop_sequences=["END", "STOP"]
        )
        with api.messages.stream(
            model="smollm2", max_tokens=100, messages=HELLO, stop_sequences=["END", "STOP"]
        ) as stream:
            streamed = "".join(stream.text_stream)
            final = stream.get_final_message()
    assert reply.content[0].text == "Counting: one two "
    assert (reply.stop_reason, reply.stop_sequence) == ("stop_sequence", "STOP")
    assert streamed == "Counting: one two "
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "STOP")
    # the engine stopped at the sequence: exactly the tokens generated up to it, nothing after
    generated = len("Counting: one two STOP")  # a token a character
    assert reply.usage.output_tokens == final.usage.output_tokens == generated


def test_a_stop_sequence_inside_thinking_ends_the_reply_there(scripted):
    # stop strings are matched on the raw generated text, before thinking is split from the answer
    script = "<think>\nFirst a plan. STOP means nothing here.\n</think>\n\nHello STOP there."
    with scripted(lambda prompt: script, QWEN3) as s:
        reply = client(s.url).messages.create(
            model="smollm2", max_tokens=100, messages=HELLO, stop_sequences=["STOP"]
        )
    assert [(b.type, getattr(b, "thinking", None)) for b in reply.content] == [("thinking", "First a plan.")]
    assert (reply.stop_reason, reply.stop_sequence) == ("stop_sequence", "STOP")
    assert reply.usage.output_tokens == len("<think>\nFirst a plan. STOP")


def test_stop_sequences_that_never_appear_leave_end_turn(scripted):
    with scripted(lambda prompt: "No stops here, though ST almost.") as s:
        reply = client(s.url).messages.create(
            model="smollm2", max_tokens=100, messages=HELLO, stop_sequences=["STOP"]
        )
    assert reply.content[0].text == "No stops here, though ST almost."
    assert (reply.stop_reason, reply.stop_sequence) == ("end_turn", None)


def test_max_tokens_cuts_the_reply_with_stop_reason_max_tokens(scripted):
    with scripted(lambda prompt: "A long answer that goes on and on.") as s:
        reply = client(s.url).messages.create(model="smollm2", max_tokens=6, messages=HELLO)
    assert reply.content[0].text == "A long"
    assert reply.stop_reason == "max_tokens"
    assert reply.usage.output_tokens == 6


def test_thinking_enabled_opens_the_think_block_and_disabled_renders_it_empty(scripted):
    with scripted(lambda prompt: "Plan it.\n</think>\n\nDone.", QWEN3) as s:
        api = client(s.url)
        on = api.messages.create(
            model="smollm2",
            max_tokens=2048,
            messages=HELLO,
            thinking={"type": "enabled", "budget_tokens": 1024},
        )
        api.messages.create(model="smollm2", max_tokens=64, messages=HELLO, thinking={"type": "disabled"})
    enabled_prompt, disabled_prompt = s.prompts
    assert enabled_prompt.endswith("<|im_start|>assistant\n<think>\n")
    assert disabled_prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in on.content] == [
        ("thinking", "Plan it."),
        ("text", "Done."),
    ]


def test_claude_codes_changing_cch_value_is_stripped_before_rendering(scripted):
    def system(cch: str) -> list[dict]:
        return [
            {
                "type": "text",
                "text": f"x-anthropic-billing-header: cc_version=2.1.9.a1b; cc_entrypoint=cli; cch={cch};",
            },
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
        ]

    with scripted(lambda prompt: "ok") as s:
        api = client(s.url)
        for cch in ("36ee5", "0aaa9"):
            api.messages.create(model="smollm2", max_tokens=8, system=system(cch), messages=HELLO)
    first, second = s.prompts
    assert first == second
    assert "cch=" not in first
    assert "cc_version=2.1.9.a1b; cc_entrypoint=cli;\n\nYou are Claude Code." in first


# what Claude Code 2.1 sends with its Agent and Skill tools on: a system message after the user's turn
MID_CONVERSATION = [
    {"role": "user", "content": [{"type": "text", "text": "Say hello."}]},
    {"role": "system", "content": [{"type": "text", "text": "# Environment\nAgents: Explore, Plan."}]},
]
MID_CONVERSATION_BETA = {"anthropic-beta": "claude-code-20250219,mid-conversation-system-2026-04-07"}


def test_a_mid_conversation_system_message_is_a_system_turn_where_it_was_sent(scripted):
    with scripted(lambda prompt: "Hello.", QWEN3) as s:
        reply = client(s.url).messages.create(
            model="smollm2",
            max_tokens=16,
            system="You are Claude Code.",
            messages=MID_CONVERSATION,
            extra_headers=MID_CONVERSATION_BETA,
        )
    assert reply.content[0].text == "Hello."
    assert s.prompts[0].endswith(
        "<|im_start|>user\nSay hello.<|im_end|>\n"
        "<|im_start|>system\n# Environment\nAgents: Explore, Plan.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_a_template_that_refuses_it_gets_it_as_a_reminder_in_the_user_turn(scripted):
    """Qwen3.5's template raises "System message must be at the beginning."; the text is folded instead."""
    with scripted(lambda prompt: "Hello.", template("qwen3.5-4b.jinja")) as s:
        body = {"model": "smollm2", "max_tokens": 16, "messages": MID_CONVERSATION}
        reply = httpx.post(s.url + "/v1/messages", json=body, headers=MID_CONVERSATION_BETA, timeout=30)
    assert reply.status_code == 200, reply.text
    assert (
        "<|im_start|>user\nSay hello.\n\n"
        "<system-reminder>\n# Environment\nAgents: Explore, Plan.\n</system-reminder><|im_end|>\n"
    ) in s.prompts[0]


def test_count_tokens_counts_the_rendered_prompt(scripted):
    with scripted(lambda prompt: "ok") as s:
        api = client(s.url)
        counted = api.messages.count_tokens(model="smollm2", system="Be brief.", messages=HELLO)
        reply = api.messages.create(model="smollm2", max_tokens=8, system="Be brief.", messages=HELLO)
    # the scripted engine's tokens are characters, so the count is the prompt's length
    assert counted.input_tokens == len(s.prompts[0])
    assert reply.usage.input_tokens + reply.usage.cache_read_input_tokens == counted.input_tokens


def test_an_engine_fault_mid_reply_becomes_an_error_event(scripted):
    with scripted(lambda prompt: "FAIL now", engine={"fail_on": "FAIL"}) as s:
        body = {"model": "smollm2", "max_tokens": 64, "stream": True, "messages": HELLO}
        response = httpx.post(s.url + "/v1/messages", json=body)
    events = read_sse(response.text)
    assert events[0][0] == "message_start"
    name, data = events[-1]
    assert name == "error"
    assert data["type"] == "error" and data["error"]["type"] == "api_error"
    assert data["error"]["message"]
