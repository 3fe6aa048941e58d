"""OpenAI's `n` where the exact shape matters: the scripted engine gives each choice its own reply, so
one choice can call a tool while another answers in prose."""

from __future__ import annotations

import json
import time

import httpx

from tests.server.dialect_helpers import HERMES_CALL, WEATHER_SCHEMA, template

ASK = [{"role": "user", "content": "Weather in Paris?"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_SCHEMA}}]
REPLIES = [HERMES_CALL, "Sunny."]


def chunks_of(url: str, body: dict) -> list[dict]:
    text = httpx.post(url + "/v1/chat/completions", json={"model": "smollm2", "stream": True, **body}).text
    lines = [line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_each_choice_has_its_own_message_tool_calls_and_finish(scripted) -> None:
    with scripted(lambda prompt: REPLIES, template("qwen3-0.6b.jinja")) as s:
        body = httpx.post(
            s.url + "/v1/chat/completions", json={"model": "smollm2", "messages": ASK, "tools": TOOLS, "n": 2}
        ).json()

    first, second = body["choices"]
    assert (first["index"], first["finish_reason"]) == (0, "tool_calls")
    assert first["message"]["content"] is None
    assert [c["function"]["name"] for c in first["message"]["tool_calls"]] == ["get_weather"]
    assert (second["index"], second["finish_reason"]) == (1, "stop")
    assert second["message"] == {"role": "assistant", "content": "Sunny.", "refusal": None}
    # one token per character here: the completion is summed over both choices
    assert body["usage"]["completion_tokens"] == len(HERMES_CALL) + len("Sunny.")


def test_streamed_choices_carry_their_index_and_one_finish_each(scripted) -> None:
    body = {"messages": ASK, "tools": TOOLS, "n": 2, "stream_options": {"include_usage": True}}
    with scripted(lambda prompt: REPLIES, template("qwen3-0.6b.jinja")) as s:
        chunks = chunks_of(s.url, body)

    *choice_chunks, usage = chunks
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == len(HERMES_CALL) + len("Sunny.")
    deltas: dict[int, list[dict]] = {0: [], 1: []}
    finishes: dict[int, list[str]] = {0: [], 1: []}
    for chunk in choice_chunks:
        (choice,) = chunk["choices"]  # one choice per chunk, as OpenAI streams them
        deltas[choice["index"]].append(choice["delta"])
        if choice["finish_reason"]:
            finishes[choice["index"]].append(choice["finish_reason"])
    assert finishes == {0: ["tool_calls"], 1: ["stop"]}
    assert [d["tool_calls"][0]["function"]["name"] for d in deltas[0] if "tool_calls" in d] == ["get_weather"]
    assert "".join(d.get("content") or "" for d in deltas[1]) == "Sunny."
    assert deltas[0][0]["role"] == deltas[1][0]["role"] == "assistant"


def test_a_client_that_leaves_frees_every_choice(scripted) -> None:
    body = {"model": "smollm2", "messages": ASK, "n": 3, "stream": True}
    with scripted(lambda prompt: "x" * 5000) as s:
        with httpx.stream("POST", s.url + "/v1/chat/completions", json=body) as reply:
            texts = 0
            for line in reply.iter_lines():
                texts += line.startswith("data: {") and '"x"' in line
                if texts >= 6:  # the three choices are decoding
                    break
        scheduler = s.server.runtime.scheduler
        for _ in range(600):
            snapshot = scheduler.snapshot()
            active = [r for r in snapshot.requests if r.finish is None]
            if snapshot.models[0].stats.rows_busy == 0 and not active:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the three rows were not freed")
        assert scheduler.outcomes["cancelled"] == 1  # one request, however many choices
