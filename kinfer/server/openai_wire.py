"""OpenAI Chat Completions and Completions: wire schemas and their translation to ChatRequest."""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any, Literal

from pydantic import Field

from kinfer.errors import InvalidRequest
from kinfer.protocol import MAX_CHOICES, ChatRequest, Message, ResponseFormat, Sampling, ToolCall, ToolSpec
from kinfer.server.logprobs_wire import logit_bias, top_count
from kinfer.server.wire import FunctionDef, WireModel, loads_arguments, tool_choice_mode, warn_dropped_tool

log = logging.getLogger(__name__)

EFFORT_LEVELS = {"minimal": "low", "low": "low", "medium": "medium", "high": "high"}


# ---- wire schemas ---------------------------------------------------------------------------


class FunctionCall(WireModel):
    name: str
    arguments: str | dict[str, Any] = "{}"


class WireToolCall(WireModel):
    id: str = ""
    type: str = "function"
    function: FunctionCall


class ContentPart(WireModel):
    type: str
    text: str | None = None


class WireMessage(WireModel):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[WireToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class WireTool(WireModel):
    type: str = "function"
    function: FunctionDef | None = None


class StreamOptions(WireModel):
    include_usage: bool = False


class SamplingFields(WireModel):
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0, le=1)
    repeat_penalty: float | None = Field(default=None, ge=0)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int | None = None  # choices: 1..MAX_CHOICES, each a row sharing one prefill
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False  # llama.cpp extension, used by benchmarks

    def top_logprob_count(self) -> int | None:
        return None

    def sampling(self) -> Sampling:
        return Sampling(logit_bias=logit_bias(self.logit_bias), logprobs=self.top_logprob_count()).given(
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            min_p=self.min_p,
            repeat_penalty=self.repeat_penalty,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            seed=self.seed,
        )

    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        stops = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if len(stops) > 16:
            raise InvalidRequest("stop: at most 16 stop sequences")
        return stops

    def check_common(self) -> None:
        if self.n is not None and not 1 <= self.n <= MAX_CHOICES:
            raise InvalidRequest(f"n: must be between 1 and {MAX_CHOICES}")


class JsonSchemaFormat(WireModel):
    name: str = ""
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class WireResponseFormat(WireModel):
    type: str = "text"
    json_schema: JsonSchemaFormat | None = None


class ChatCompletionRequest(SamplingFields):
    model: str = ""
    messages: list[WireMessage]
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[WireTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None  # None: allowed, as OpenAI's default
    reasoning_effort: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    response_format: WireResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None

    def top_logprob_count(self) -> int | None:
        return top_count(self.logprobs, self.top_logprobs)


class CompletionRequest(SamplingFields):
    model: str = ""
    prompt: str | list[str]
    max_tokens: int | None = Field(default=16, ge=1)
    echo: bool = False
    suffix: str | None = None
    logprobs: int | None = None  # legacy: how many alternatives per token (0 = the chosen one only)

    def top_logprob_count(self) -> int | None:
        return None if self.logprobs is None else top_count(True, self.logprobs, top_name="logprobs")


# ---- wire -> ChatRequest ----------------------------------------------------------------------


def content_text(content: str | list[ContentPart] | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for part in content:
        if part.type in ("text", "input_text", "output_text"):
            texts.append(part.text or "")
        elif part.type in ("image_url", "input_image", "image", "input_audio", "file"):
            raise InvalidRequest(f"content part of type {part.type!r}: this model reads text only")
        else:
            raise InvalidRequest(f"unknown content part type {part.type!r}")
    return "".join(texts)


def parse_arguments(arguments: str | dict[str, Any]) -> dict[str, Any]:
    if isinstance(arguments, dict):
        return arguments
    try:
        value = loads_arguments(arguments, "tool call arguments")
    except json.JSONDecodeError:
        raise InvalidRequest(f"tool call arguments are not valid JSON: {arguments[:80]!r}") from None
    if not isinstance(value, dict):
        raise InvalidRequest("tool call arguments must be a JSON object")
    return value


def to_messages(wire: list[WireMessage]) -> tuple[Message, ...]:
    names_by_call: dict[str, str] = {}
    messages = []
    for m in wire:
        role = {"developer": "system", "function": "tool"}.get(m.role, m.role)
        calls = tuple(
            ToolCall(
                id=c.id or f"call_{uuid.uuid4().hex[:24]}",
                name=c.function.name,
                arguments=parse_arguments(c.function.arguments),
            )
            for c in m.tool_calls or ()
        )
        for call in calls:
            names_by_call[call.id] = call.name
        name = m.name
        if role == "tool" and not name and m.tool_call_id:
            name = names_by_call.get(m.tool_call_id)
        messages.append(
            Message(
                role=role,  # type: ignore[arg-type]
                content=content_text(m.content),
                thinking=m.reasoning_content or m.reasoning,
                tool_calls=calls,
                tool_call_id=m.tool_call_id,
                name=name,
            )
        )
    return tuple(messages)


def to_tools(wire: list[WireTool] | None) -> tuple[ToolSpec, ...]:
    tools = []
    for tool in wire or ():
        if tool.type != "function" or tool.function is None:
            warn_dropped_tool("openai", str(tool.type))
            continue
        f = tool.function
        tools.append(ToolSpec(name=f.name, description=f.description, parameters=f.parameters))
    return tuple(tools)


def tool_choice_name(choice: str | dict[str, Any] | None) -> str:
    if choice is None:
        return "auto"
    if isinstance(choice, str):
        return tool_choice_mode(choice)
    function = choice.get("function") or {}
    name = function.get("name") if isinstance(function, dict) else None
    if not name:
        raise InvalidRequest("tool_choice: give {'type': 'function', 'function': {'name': ...}}")
    return str(name)


def think_from(effort: str | None, template_kwargs: dict[str, Any] | None) -> tuple[bool | None, Any]:
    if template_kwargs and "enable_thinking" in template_kwargs:
        return bool(template_kwargs["enable_thinking"]), None
    if effort is None:
        return None, None
    if effort == "none":
        return False, None
    if effort not in EFFORT_LEVELS:
        raise InvalidRequest("reasoning_effort must be one of none, minimal, low, medium, high")
    return True, EFFORT_LEVELS[effort]


def response_format(wire: WireResponseFormat | None) -> ResponseFormat | None:
    """`response_format`: text (no constraint), a JSON object, or JSON valid against a schema."""
    if wire is None or wire.type == "text":
        return None
    if wire.type == "json_object":
        return ResponseFormat("json_object")
    if wire.type != "json_schema":
        raise InvalidRequest("response_format.type must be 'text', 'json_object' or 'json_schema'")
    spec = wire.json_schema
    if spec is None or spec.schema_ is None:
        raise InvalidRequest("response_format.json_schema.schema: required for type 'json_schema'")
    return ResponseFormat("json_schema", spec.schema_, name=spec.name, strict=bool(spec.strict))


def to_request(wire: ChatCompletionRequest, request_id: str) -> ChatRequest:
    wire.check_common()
    think, level = think_from(wire.reasoning_effort, wire.chat_template_kwargs)
    tools = to_tools(wire.tools)
    choice = tool_choice_name(wire.tool_choice)
    return ChatRequest(
        model=wire.model,
        messages=to_messages(wire.messages),
        tools=() if choice == "none" else tools,
        tool_choice=choice,
        parallel_tool_calls=wire.parallel_tool_calls is not False,
        response_format=response_format(wire.response_format),
        sampling=wire.sampling(),
        max_tokens=wire.max_completion_tokens or wire.max_tokens,
        stop=wire.stops(),
        think=think,
        think_level=level,
        ignore_eos=wire.ignore_eos,
        dialect="openai",
        request_id=request_id,
        n=wire.n or 1,
    )


def completion_request(wire: CompletionRequest, request_id: str) -> ChatRequest:
    wire.check_common()
    prompts = [wire.prompt] if isinstance(wire.prompt, str) else wire.prompt
    if len(prompts) != 1:
        raise InvalidRequest("prompt: send one prompt per request")
    if wire.suffix:
        raise InvalidRequest("suffix: fill-in-the-middle is not supported")
    return ChatRequest(
        model=wire.model,
        raw_prompt=prompts[0],
        sampling=wire.sampling(),
        max_tokens=wire.max_tokens,
        stop=wire.stops(),
        ignore_eos=wire.ignore_eos,
        dialect="openai",
        request_id=request_id,
        n=wire.n or 1,
    )
