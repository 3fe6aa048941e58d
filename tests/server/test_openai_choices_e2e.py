"""OpenAI's `n` against the real server (bundled SmolLM2 on llama.cpp), with the official SDK: n
choices from one prefill, each its own text and finish, streamed with `index`, seeded reproducibly."""

from __future__ import annotations

import json
import re
import time

import httpx
import openai
import pytest

from tests.live_server import LiveServer

STORY = [{"role": "user", "content": "Write one sentence about a fox and a crow."}]
SEEDED = {"temperature": 1.0, "top_p": 1.0, "seed": 5}


@pytest.fixture(scope="module")
def client(smol_server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=smol_server.url + "/v1", api_key="unused", max_retries=0)


def metric(server: LiveServer, name: str) -> float:
    text = httpx.get(server.url + "/metrics").text
    match = re.search(rf"^{name}(?:\{{[^}}]*\}})? (\S+)$", text, re.M)
    assert match, f"{name} is not on /metrics"
    return float(match[1])


def test_four_seeded_choices_differ_share_one_prefill_and_repeat(smol_server: LiveServer, client):
    client.chat.completions.create(model="smollm2", messages=STORY, max_tokens=1)  # loads the model
    computed = metric(smol_server, "kinfer_prompt_tokens_computed_total")
    reply = client.chat.completions.create(model="smollm2", messages=STORY, max_tokens=24, n=4, **SEEDED)

    texts = [choice.message.content for choice in reply.choices]
    assert [choice.index for choice in reply.choices] == [0, 1, 2, 3]
    assert len(set(texts)) == 4, texts
    assert all(choice.finish_reason in ("stop", "length") for choice in reply.choices)
    # the prompt counted once; the completion summed over the four choices
    usage = reply.usage
    assert usage.completion_tokens > 4 and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    # prefilled once: the engine computed the prompt's uncached tokens once, not four times
    cached = usage.prompt_tokens_details.cached_tokens
    assert cached < usage.prompt_tokens
    computed = metric(smol_server, "kinfer_prompt_tokens_computed_total") - computed
    assert computed == usage.prompt_tokens - cached

    again = client.chat.completions.create(model="smollm2", messages=STORY, max_tokens=24, n=4, **SEEDED)
    assert [choice.message.content for choice in again.choices] == texts
    single = client.chat.completions.create(model="smollm2", messages=STORY, max_tokens=24, **SEEDED)
    assert single.choices[0].message.content == texts[0]  # choice 0 draws with the request's seed


def test_streamed_choices_each_get_their_text_and_a_finish(client):
    whole = client.chat.completions.create(model="smollm2", messages=STORY, max_tokens=24, n=4, **SEEDED)
    chunks = list(
        client.chat.completions.create(
            model="smollm2",
            messages=STORY,
            max_tokens=24,
            n=4,
            stream=True,
            stream_options={"include_usage": True},
            **SEEDED,
        )
    )

    texts, finishes = ["" for _ in range(4)], [[] for _ in range(4)]
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finishes[choice.index].append(choice.finish_reason)
    assert texts == [choice.message.content for choice in whole.choices]
    assert finishes == [[choice.finish_reason] for choice in whole.choices]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert [c.choices[0].index for c in chunks[:4]] == [0, 1, 2, 3]  # every choice opens with its role


def test_greedy_choices_are_the_single_greedy_reply(client):
    single = client.chat.completions.create(model="smollm2", messages=STORY, max_tokens=24, temperature=0)
    both = client.chat.completions.create(model="smollm2", messages=STORY, max_tokens=24, temperature=0, n=2)

    assert [c.message.content for c in both.choices] == [single.choices[0].message.content] * 2
    assert both.usage.prompt_tokens == single.usage.prompt_tokens
    assert both.usage.completion_tokens == 2 * single.usage.completion_tokens


def test_legacy_completions_return_n_choices(client):
    reply = client.completions.create(
        model="smollm2", prompt="Once upon a time", max_tokens=12, n=3, **SEEDED
    )

    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert len({c.text for c in reply.choices}) == 3
    assert reply.usage.completion_tokens == 36


def test_every_choice_follows_the_json_schema(client):
    schema = {
        "type": "object",
        "properties": {"animal": {"type": "string", "enum": ["fox", "crow"]}, "age": {"type": "integer"}},
        "required": ["animal", "age"],
    }
    reply = client.chat.completions.create(
        model="smollm2",
        messages=STORY,
        max_tokens=48,
        n=3,
        response_format={"type": "json_schema", "json_schema": {"name": "pet", "schema": schema}},
        **SEEDED,
    )

    for choice in reply.choices:
        value = json.loads(choice.message.content)
        assert value["animal"] in ("fox", "crow") and isinstance(value["age"], int)


def test_more_choices_than_rows_is_a_400(smol_server: LiveServer):
    reply = httpx.post(
        smol_server.url + "/v1/chat/completions",
        json={"model": "smollm2", "messages": STORY, "n": 5},  # the server decodes 4 rows
        timeout=60,
    )
    assert reply.status_code == 400
    assert reply.json()["error"]["type"] == "invalid_request_error"
    assert "n:" in reply.json()["error"]["message"]


def test_disconnecting_mid_stream_frees_every_choice_row(smol_server: LiveServer):
    # 4 x 4000 tokens would take the rows most of a minute: the client leaves long before
    body = {"model": "smollm2", "messages": STORY, "max_tokens": 4000, "n": 4, "stream": True}
    body["ignore_eos"] = True
    outcomes = smol_server.runtime.scheduler.outcomes
    cancelled = outcomes["cancelled"]
    with httpx.stream("POST", smol_server.url + "/v1/chat/completions", json=body, timeout=60) as reply:
        seen = 0
        # held by name: a line iterator dropped on `break` is finalized at once, and closing it closes
        # the connection (the server would cancel before the rows are seen busy)
        lines = reply.iter_lines()
        for line in lines:
            seen += line.startswith("data: {")
            if seen >= 12:  # the four role chunks and some text: all four rows are decoding
                break
        wait_for(lambda: metric(smol_server, "kinfer_rows_busy") == 4, "the four rows never showed busy")
    wait_for(lambda: metric(smol_server, "kinfer_rows_busy") == 0, "the rows were not freed", timeout=10)
    wait_for(lambda: outcomes["cancelled"] == cancelled + 1, "the request was not cancelled", timeout=10)
    assert metric(smol_server, "kinfer_requests_active") == 0


def wait_for(condition, why: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, why
        time.sleep(0.05)


def test_a_forced_tool_call_is_made_in_every_choice(client):
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
    reply = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[weather],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=64,
        n=2,
        **SEEDED,
    )

    for choice in reply.choices:
        assert choice.finish_reason == "tool_calls"
        (call,) = choice.message.tool_calls
        assert call.function.name == "get_weather" and "city" in json.loads(call.function.arguments)


def test_each_choice_carries_its_own_logprobs_whole_and_streamed(client):
    asked = {"logprobs": True, "top_logprobs": 2, **SEEDED}
    whole = client.chat.completions.create(model="smollm2", messages=STORY, max_tokens=12, n=3, **asked)
    chunks = list(
        client.chat.completions.create(
            model="smollm2", messages=STORY, max_tokens=12, n=3, stream=True, **asked
        )
    )

    streamed: list[list] = [[] for _ in range(3)]
    for chunk in chunks:
        for choice in chunk.choices:
            if choice.logprobs is not None:
                streamed[choice.index] += choice.logprobs.content
    texts = [choice.message.content for choice in whole.choices]
    assert len(set(texts)) == 3, texts
    for choice in whole.choices:
        content = choice.logprobs.content
        # a choice's logprobs spell its own text, token by token, each with two alternatives
        assert "".join(entry.token for entry in content) == texts[choice.index]
        assert all(len(entry.top_logprobs) == 2 for entry in content)
        assert [e.token for e in streamed[choice.index]] == [e.token for e in content]


def test_legacy_completion_choices_each_get_their_own_logprob_columns(client):
    reply = client.completions.create(
        model="smollm2", prompt="Once upon a time", max_tokens=8, n=2, logprobs=1, **SEEDED
    )

    assert len({c.text for c in reply.choices}) == 2
    for choice in reply.choices:
        columns = choice.logprobs
        assert "".join(columns.tokens) == choice.text
        # offsets count within the choice's own text, from 0
        assert columns.text_offset[0] == 0
        assert len(columns.token_logprobs) == len(columns.tokens) == len(columns.top_logprobs)
