"""OpenAI Responses where the exact reply matters: the scripted engine writes it, the rest is real."""

from __future__ import annotations

import logging

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


# ---- Codex's namespace tools and hosted tools ---------------------------------------------------

DOCS_SEARCH = {
    "type": "function",
    "name": "search",
    "description": "Search the docs.",
    "strict": False,
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
}
# what Codex sends for an MCP server's tools, next to its own function tools and a hosted one
CODEX_TOOLS = [
    {
        "type": "namespace",
        "name": "mcp__docs__",
        "description": "Tools of the docs server.",
        "tools": [DOCS_SEARCH],
    },
    {"type": "web_search"},
]
NAMESPACED_CALL = (
    '<tool_call>\n{"name": "mcp__docs__search", "arguments": {"query": "kv cache"}}\n</tool_call>'
)


def calls_the_docs_search(prompt: str) -> str:
    """A model that calls the namespaced function by the name it was shown, then answers."""
    if "Found: paging." in prompt:
        return "It pages."
    return NAMESPACED_CALL if '"name": "mcp__docs__search"' in prompt else "I have no tools."


def test_a_namespace_tool_is_expanded_and_its_call_names_the_namespace(scripted):
    with scripted(calls_the_docs_search) as s:
        api = client(s.url)
        reply = api.responses.create(model="smollm2", input="How is the KV cache kept?", tools=CODEX_TOOLS)
        body = {"model": "smollm2", "input": "Again.", "tools": CODEX_TOOLS, "stream": True}
        events = [d for _, d in read_sse(httpx.post(s.url + "/v1/responses", json=body).text)]
    (call,) = reply.output
    assert (call.type, call.name, call.arguments) == ("function_call", "search", '{"query": "kv cache"}')
    assert call.model_dump()["namespace"] == "mcp__docs__"  # how Codex routes the call back
    (done,) = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert (done["namespace"], done["name"]) == ("mcp__docs__", "search")
    assert [t.type for t in reply.tools] == ["namespace"]  # web_search was dropped
    assert "web_search" not in s.prompts[0]


def test_a_replayed_namespaced_call_is_shown_to_the_model_under_its_flat_name(scripted):
    """Codex sends `store: false` and replays its items; the call comes back with namespace and name."""
    with scripted(calls_the_docs_search) as s:
        api = client(s.url)
        first = api.responses.create(model="smollm2", input="How?", tools=CODEX_TOOLS, store=False)
        call = first.output[0]
        second = api.responses.create(
            model="smollm2",
            tools=CODEX_TOOLS,
            store=False,
            input=[
                {"role": "user", "content": "How?"},
                call.model_dump(exclude_none=True),
                {"type": "function_call_output", "call_id": call.call_id, "output": "Found: paging."},
            ],
        )
    assert second.output_text == "It pages."
    assert NAMESPACED_CALL in s.prompts[-1]


def test_a_hosted_tool_is_dropped_with_one_warning_per_type_not_per_request(scripted, caplog):
    caplog.set_level(logging.WARNING, logger="kinfer.server.responses_tools")
    with scripted(lambda prompt: "ok") as s:
        api = client(s.url)
        for _ in range(3):
            api.responses.create(model="smollm2", input="Hi.", tools=[{"type": "web_search"}])
        api.responses.create(model="smollm2", input="Hi.", tools=[{"type": "file_search"}])
    warnings = [r.getMessage() for r in caplog.records if r.name == "kinfer.server.responses_tools"]
    assert len(warnings) == 2
    assert "'web_search'" in warnings[0] and "'file_search'" in warnings[1]


# ---- input items ------------------------------------------------------------------------------


def test_input_items_lists_the_input_newest_first_a_page_at_a_time(scripted):
    items = [
        {"role": "user", "content": "One."},
        {"role": "assistant", "content": "Two."},
        {"role": "user", "content": [{"type": "input_text", "text": "Three."}]},
    ]
    with scripted(lambda prompt: "ok") as s:
        api = client(s.url)
        reply = api.responses.create(model="smollm2", input=items)
        listed = list(api.responses.input_items.list(reply.id))  # the SDK pages through them
        first = httpx.get(f"{s.url}/v1/responses/{reply.id}/input_items", params={"limit": 2}).json()
        rest = httpx.get(
            f"{s.url}/v1/responses/{reply.id}/input_items",
            params={"limit": 2, "after": first["last_id"]},
        ).json()
        ascending = httpx.get(f"{s.url}/v1/responses/{reply.id}/input_items", params={"order": "asc"}).json()
        missing = httpx.get(f"{s.url}/v1/responses/resp_gone/input_items")
    assert [item.content[0].text for item in listed] == ["Three.", "Two.", "One."]
    assert [(item.type, item.role) for item in listed] == [
        ("message", "user"),
        ("message", "assistant"),
        ("message", "user"),
    ]
    assert all(item.id.startswith("msg_") for item in listed)
    assert first["object"] == "list" and first["has_more"] is True and len(first["data"]) == 2
    assert first["first_id"] == first["data"][0]["id"]
    assert [i["content"][0]["text"] for i in rest["data"]] == ["One."] and rest["has_more"] is False
    assert [i["content"][0]["text"] for i in ascending["data"]] == ["One.", "Two.", "Three."]
    assert missing.status_code == 404


def test_an_item_reference_is_resolved_against_stored_items(scripted):
    with scripted(lambda prompt: "Noted." if "Follow" in prompt else "Blue.") as s:
        api = client(s.url)
        first = api.responses.create(model="smollm2", input="Pick a colour.")
        (asked,) = api.responses.input_items.list(first.id)
        answered = first.output[0]
        second = api.responses.create(
            model="smollm2",
            input=[
                {"type": "item_reference", "id": asked.id},
                {"type": "item_reference", "id": answered.id},
                {"role": "user", "content": "Follow up."},
            ],
        )
        unknown = httpx.post(
            s.url + "/v1/responses",
            json={"model": "smollm2", "input": [{"type": "item_reference", "id": "msg_gone"}]},
        )
    assert second.output_text == "Noted."
    assert (
        "<|im_start|>user\nPick a colour.<|im_end|>\n<|im_start|>assistant\nBlue.<|im_end|>\n"
        "<|im_start|>user\nFollow up."
    ) in s.prompts[-1]
    assert unknown.status_code == 400 and "msg_gone" in unknown.json()["error"]["message"]
