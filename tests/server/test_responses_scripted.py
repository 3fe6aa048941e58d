"""OpenAI Responses where the exact reply matters: the scripted engine writes it, the rest is real."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.server.dialect_helpers import read_sse, template

QWEN3 = template("qwen3-0.6b.jinja")


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def test_the_stream_has_the_full_event_sequence_with_numbers_and_indexes(scripted):
    with scripted(lambda prompt: "<think>\nHm.\n</think>\n\nHi!", QWEN3) as s:
        body = {"model": "smollm2", "input": "Say hi.", "stream": True}
        response = httpx.post(s.url + "/v1/responses", json=body)
    events = [data for _, data in read_sse(response.text)]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert all(name == data["type"] for name, data in read_sse(response.text))
    reasoning_id = events[2]["item"]["id"]
    message_id = events[10]["item"]["id"]

    def describe(e: dict) -> tuple:
        where = tuple(e[k] for k in ("output_index", "item_id", "content_index", "summary_index") if k in e)
        return (e["type"], *where)

    assert [describe(e) for e in events] == [
        ("response.created",),
        ("response.in_progress",),
        ("response.output_item.added", 0),
        ("response.reasoning_summary_part.added", 0, reasoning_id, 0),
        *[("response.reasoning_summary_text.delta", 0, reasoning_id, 0)] * 3,
        ("response.reasoning_summary_text.done", 0, reasoning_id, 0),
        ("response.reasoning_summary_part.done", 0, reasoning_id, 0),
        ("response.output_item.done", 0),
        ("response.output_item.added", 1),
        ("response.content_part.added", 1, message_id, 0),
        *[("response.output_text.delta", 1, message_id, 0)] * 3,
        ("response.output_text.done", 1, message_id, 0),
        ("response.content_part.done", 1, message_id, 0),
        ("response.output_item.done", 1),
        ("response.completed",),
    ]
    assert reasoning_id.startswith("rs_") and message_id.startswith("msg_")
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    completed = events[-1]["response"]
    assert completed["status"] == "completed"
    assert [item["type"] for item in completed["output"]] == ["reasoning", "message"]
    assert completed["output"][0]["summary"] == [{"type": "summary_text", "text": "Hm."}]
    assert completed["output"][1]["content"][0]["text"] == "Hi!"
    assert completed["usage"]["output_tokens"] == len("<think>\nHm.\n</think>\n\nHi!")
    assert completed["usage"]["output_tokens_details"]["reasoning_tokens"] > 0


def test_the_sdk_stream_and_create_agree(scripted):
    with scripted(lambda prompt: "<think>\nHm.\n</think>\n\nHello there.", QWEN3) as s:
        api = client(s.url)
        whole = api.responses.create(model="smollm2", input="Say hi.")
        with api.responses.stream(model="smollm2", input="Say hi.") as stream:
            deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
            final = stream.get_final_response()
    assert "".join(deltas) == whole.output_text == final.output_text == "Hello there."
    assert whole.output[0].summary[0].text == final.output[0].summary[0].text == "Hm."
    assert whole.id != final.id and whole.id.startswith("resp_")


def test_max_output_tokens_makes_the_response_incomplete(scripted):
    with scripted(lambda prompt: "A long answer that goes on and on.") as s:
        api = client(s.url)
        reply = api.responses.create(model="smollm2", input="Talk.", max_output_tokens=6)
        body = {"model": "smollm2", "input": "Talk.", "max_output_tokens": 6, "stream": True}
        events = [d for _, d in read_sse(httpx.post(s.url + "/v1/responses", json=body).text)]
    assert reply.status == "incomplete"
    assert reply.incomplete_details.reason == "max_output_tokens"
    assert reply.output_text == "A long"
    assert reply.output[0].status == "incomplete"
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


@pytest.mark.parametrize(
    ("effort", "prompt_end"),
    [
        ("high", "<|im_start|>assistant\n<think>\n"),
        ("none", "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
    ],
)
def test_reasoning_effort_sets_the_think_mode(scripted, effort, prompt_end):
    with scripted(lambda prompt: "ok", QWEN3) as s:
        reply = client(s.url).responses.create(model="smollm2", input="Hi.", reasoning={"effort": effort})
    assert s.prompts[0].endswith(prompt_end)
    assert reply.reasoning.effort == effort


def test_instructions_are_the_system_prompt_and_are_not_carried_over(scripted):
    with scripted(lambda prompt: "ok") as s:
        api = client(s.url)
        first = api.responses.create(model="smollm2", instructions="Talk like a pirate.", input="Hi.")
        api.responses.create(
            model="smollm2", instructions="Be formal.", previous_response_id=first.id, input="Again."
        )
    first_prompt, second_prompt = s.prompts
    assert first_prompt.startswith("<|im_start|>system\nTalk like a pirate.<|im_end|>")
    assert second_prompt.startswith("<|im_start|>system\nBe formal.<|im_end|>")
    assert "pirate" not in second_prompt
    assert (
        "<|im_start|>user\nHi.<|im_end|>\n<|im_start|>assistant\nok<|im_end|>\n<|im_start|>user\nAgain."
        in (second_prompt)
    )


def test_retrieve_and_delete_a_stored_response(scripted):
    with scripted(lambda prompt: "ok") as s:
        api = client(s.url)
        reply = api.responses.create(model="smollm2", input="Hi.")
        assert api.responses.retrieve(reply.id).output_text == "ok"
        api.responses.delete(reply.id)
        with pytest.raises(openai.NotFoundError):
            api.responses.retrieve(reply.id)
        unstored = api.responses.create(model="smollm2", input="Hi.", store=False)
        with pytest.raises(openai.NotFoundError):
            api.responses.retrieve(unstored.id)


def test_an_unknown_previous_response_id_is_a_404_in_openais_shape(scripted):
    with scripted(lambda prompt: "ok") as s:
        response = httpx.post(
            s.url + "/v1/responses",
            json={"model": "smollm2", "input": "Hi.", "previous_response_id": "resp_gone"},
        )
    assert response.status_code == 404
    assert response.json() == {
        "error": {
            "message": "Previous response with id 'resp_gone' not found.",
            "type": "invalid_request_error",
            "param": "previous_response_id",
            "code": "previous_response_not_found",
        }
    }


def test_only_function_tools_are_served(scripted):
    tools = [
        {"type": "web_search"},
        {
            "type": "function",
            "name": "get_time",
            "description": "The time.",
            "parameters": {"type": "object"},
        },
    ]
    with scripted(lambda prompt: "ok", QWEN3) as s:
        reply = client(s.url).responses.create(model="smollm2", input="Hi.", tools=tools)
    assert '"name": "get_time"' in s.prompts[0] and "web_search" not in s.prompts[0]
    assert [t.type for t in reply.tools] == ["function"]


def test_an_image_part_is_a_400(scripted):
    image = {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}
    with scripted(lambda prompt: "ok") as s, pytest.raises(openai.BadRequestError) as caught:
        client(s.url).responses.create(
            model="smollm2",
            input=[{"role": "user", "content": [image, {"type": "input_text", "text": "?"}]}],
        )
    assert "text-only" in caught.value.body["message"]


def test_structured_output_is_refused_rather_than_ignored(scripted):
    schema = {"type": "json_schema", "name": "x", "schema": {"type": "object"}}
    with scripted(lambda prompt: "ok") as s, pytest.raises(openai.BadRequestError) as caught:
        client(s.url).responses.create(model="smollm2", input="Hi.", text={"format": schema})
    assert "text.format" in caught.value.body["message"]


def test_an_engine_fault_mid_reply_fails_the_response_in_stream(scripted):
    with scripted(lambda prompt: "FAIL now", engine={"fail_on": "FAIL"}) as s:
        body = {"model": "smollm2", "input": "Hi.", "stream": True}
        events = [d for _, d in read_sse(httpx.post(s.url + "/v1/responses", json=body).text)]
        assert events[0]["type"] == "response.created"
        failed = events[-1]
        assert failed["type"] == "response.failed"
        assert failed["response"]["status"] == "failed"
        assert failed["response"]["error"]["code"] == "server_error"
        with pytest.raises(openai.InternalServerError):
            client(s.url).responses.create(model="smollm2", input="Hi.")
