"""Structured output and forced tool calls in each dialect's own words, over plain HTTP, with the reply
brought back to one shape (the answer text, or the calls made and how the reply ended)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from tests.constrain.schemas import PERSON_PROMPT, WEATHER_PROMPT, WEATHER_TOOL
from tests.server.dialect_helpers import read_sse

MODEL = "smollm2"
TIMEOUT = 300


def answer_openai(url: str, schema: dict[str, Any], seed: int) -> str:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PERSON_PROMPT}],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": schema, "strict": True},
        },
        "temperature": 0.8,
        "seed": seed,
        "max_tokens": 200,
    }
    reply = httpx.post(url + "/v1/chat/completions", json=body, timeout=TIMEOUT).json()
    return reply["choices"][0]["message"]["content"]


def answer_responses(url: str, schema: dict[str, Any], seed: int) -> str:
    body = {
        "model": MODEL,
        "input": PERSON_PROMPT,
        "text": {"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}},
        "temperature": 0.8,
        "max_output_tokens": 200,
    }
    reply = httpx.post(url + "/v1/responses", json=body, timeout=TIMEOUT).json()
    assert reply["text"]["format"]["type"] == "json_schema"
    return "".join(
        part["text"] for item in reply["output"] if item["type"] == "message" for part in item["content"]
    )


def answer_anthropic(url: str, schema: dict[str, Any], seed: int) -> str:
    body = {
        "model": MODEL,
        "max_tokens": 200,
        "messages": [{"role": "user", "content": PERSON_PROMPT}],
        "output_config": {"format": {"type": "json_schema", "schema": schema}},
        "temperature": 0.8,
    }
    reply = httpx.post(url + "/v1/messages", json=body, timeout=TIMEOUT).json()
    return "".join(block["text"] for block in reply["content"] if block["type"] == "text")


def answer_ollama(url: str, schema: dict[str, Any], seed: int) -> str:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PERSON_PROMPT}],
        "format": schema,
        "stream": False,
        "options": {"temperature": 0.8, "seed": seed, "num_predict": 200},
    }
    return httpx.post(url + "/api/chat", json=body, timeout=TIMEOUT).json()["message"]["content"]


ANSWER: dict[str, Callable[[str, dict[str, Any], int], str]] = {
    "openai": answer_openai,
    "responses": answer_responses,
    "anthropic": answer_anthropic,
    "ollama": answer_ollama,
}


# ---- forced tool calls ------------------------------------------------------------------------


@dataclass(frozen=True)
class Calls:
    """The calls a reply made, with their arguments parsed, and the dialect's word for how it ended."""

    calls: list[tuple[str, dict[str, Any]]]
    finish: str


def _stream(url: str, path: str, body: dict[str, Any]) -> list[tuple[str | None, dict]]:
    reply = httpx.post(url + path, json={**body, "stream": True}, timeout=TIMEOUT)
    assert reply.status_code == 200, reply.text
    return read_sse(reply.text)


def call_openai(url: str, named: bool, stream: bool) -> Calls:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": WEATHER_PROMPT}],
        "tools": [{"type": "function", "function": WEATHER_TOOL}],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}} if named else "required",
        "parallel_tool_calls": False,
        "temperature": 0,
        "max_tokens": 120,
    }
    if not stream:
        choice = httpx.post(url + "/v1/chat/completions", json=body, timeout=TIMEOUT).json()["choices"][0]
        calls = [
            (c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in choice["message"]["tool_calls"]
        ]
        return Calls(calls, choice["finish_reason"])
    names: dict[int, str] = {}
    arguments: dict[int, str] = {}
    finish = ""
    for _, chunk in _stream(url, "/v1/chat/completions", body):
        for choice in chunk.get("choices", []):
            for delta in choice["delta"].get("tool_calls") or []:
                names[delta["index"]] = names.get(delta["index"], "") + (delta["function"].get("name") or "")
                arguments[delta["index"]] = arguments.get(delta["index"], "") + (
                    delta["function"].get("arguments") or ""
                )
            finish = choice.get("finish_reason") or finish
    return Calls([(names[i], json.loads(arguments[i])) for i in sorted(names)], finish)


def call_responses(url: str, named: bool, stream: bool) -> Calls:
    body = {
        "model": MODEL,
        "input": WEATHER_PROMPT,
        "tools": [{"type": "function", **WEATHER_TOOL}],
        "tool_choice": {"type": "function", "name": "get_weather"} if named else "required",
        "parallel_tool_calls": False,
        "temperature": 0,
        "max_output_tokens": 120,
    }
    if stream:
        events = _stream(url, "/v1/responses", body)
        response = next(data["response"] for name, data in events if name == "response.completed")
    else:
        response = httpx.post(url + "/v1/responses", json=body, timeout=TIMEOUT).json()
    calls = [
        (i["name"], json.loads(i["arguments"])) for i in response["output"] if i["type"] == "function_call"
    ]
    return Calls(calls, response["status"])


def call_anthropic(url: str, named: bool, stream: bool) -> Calls:
    body = {
        "model": MODEL,
        "max_tokens": 120,
        "messages": [{"role": "user", "content": WEATHER_PROMPT}],
        "tools": [
            {
                "name": WEATHER_TOOL["name"],
                "description": WEATHER_TOOL["description"],
                "input_schema": WEATHER_TOOL["parameters"],
            }
        ],
        "tool_choice": {"type": "tool", "name": "get_weather"}
        if named
        else {"type": "any", "disable_parallel_tool_use": True},
        "temperature": 0,
    }
    if not stream:
        reply = httpx.post(url + "/v1/messages", json=body, timeout=TIMEOUT).json()
        calls = [(b["name"], b["input"]) for b in reply["content"] if b["type"] == "tool_use"]
        return Calls(calls, reply["stop_reason"])
    blocks: dict[int, dict[str, Any]] = {}
    finish = ""
    for name, data in _stream(url, "/v1/messages", body):
        if name == "content_block_start" and data["content_block"]["type"] == "tool_use":
            blocks[data["index"]] = {"name": data["content_block"]["name"], "json": ""}
        elif name == "content_block_delta" and data["delta"]["type"] == "input_json_delta":
            blocks[data["index"]]["json"] += data["delta"]["partial_json"]
        elif name == "message_delta":
            finish = data["delta"]["stop_reason"]
    return Calls([(b["name"], json.loads(b["json"])) for _, b in sorted(blocks.items())], finish)


def call_ollama(url: str, named: bool, stream: bool) -> Calls:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": WEATHER_PROMPT}],
        "tools": [{"type": "function", "function": WEATHER_TOOL}],
        # kinfer's extension: Ollama itself has no way to force a call
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}} if named else "required",
        "parallel_tool_calls": False,
        "stream": stream,
        "options": {"temperature": 0, "num_predict": 120},
    }
    reply = httpx.post(url + "/api/chat", json=body, timeout=TIMEOUT)
    lines = [json.loads(line) for line in reply.text.splitlines() if line.strip()]
    calls = [
        (c["function"]["name"], c["function"]["arguments"])
        for line in lines
        for c in line["message"].get("tool_calls") or []
    ]
    return Calls(calls, lines[-1]["done_reason"])


CALL: dict[str, Callable[[str, bool, bool], Calls]] = {
    "openai": call_openai,
    "responses": call_responses,
    "anthropic": call_anthropic,
    "ollama": call_ollama,
}
# how each dialect says "the reply is a tool call"
CALL_FINISH = {"openai": "tool_calls", "responses": "completed", "anthropic": "tool_use", "ollama": "stop"}
