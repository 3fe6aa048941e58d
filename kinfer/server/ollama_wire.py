"""Ollama's /api/* wire schemas and their translation to ChatRequest."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any, Literal

from pydantic import Field

from kinfer.chat.go_template import render_go_template
from kinfer.config import parse_duration
from kinfer.errors import InvalidRequest
from kinfer.protocol import ChatRequest, Message, ResponseFormat, Sampling, ThinkLevel, ToolCall, ToolSpec
from kinfer.server.logprobs_wire import top_count
from kinfer.server.wire import FunctionDef, WireModel, tool_choice_mode

# ---- wire schemas ---------------------------------------------------------------------------


OLLAMA_SAMPLING = Sampling(repeat_penalty=1.1)  # Ollama's defaults differ from llama.cpp's here


class Options(WireModel):
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0, le=1)
    repeat_penalty: float | None = Field(default=None, ge=0)
    repeat_last_n: int | None = Field(default=None, ge=-1)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    num_predict: int | None = None
    seed: int | None = None
    stop: list[str] | str | None = None
    num_ctx: int | None = Field(default=None, ge=1)

    def sampling(self) -> Sampling:
        return OLLAMA_SAMPLING.given(
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            min_p=self.min_p,
            repeat_penalty=self.repeat_penalty,
            repeat_last_n=None if self.repeat_last_n == -1 else self.repeat_last_n,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            seed=self.seed,
        )

    def max_tokens(self) -> int | None:
        # Ollama: -1 = until the context is full, -2 = fill the context; both mean "no limit" here
        return None if self.num_predict is None or self.num_predict < 0 else max(1, self.num_predict)

    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class WireFunction(WireModel):
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class WireToolCall(WireModel):
    id: str | None = None
    function: WireFunction


class WireMessage(WireModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    thinking: str | None = None
    images: list[str] | None = None
    tool_calls: list[WireToolCall] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None


class WireTool(WireModel):
    type: str = "function"
    function: FunctionDef


Think = bool | Literal["low", "medium", "high", "max"] | None
THINK_LEVELS: dict[str, ThinkLevel] = {"low": "low", "medium": "medium", "high": "high", "max": "high"}
MAX_TOKEN_ID = 2**31 - 1
KeepAlive = str | float | int | None


class ChatBody(WireModel):
    model: str = ""
    messages: list[WireMessage] = Field(default_factory=list)
    tools: list[WireTool] | None = None
    # kinfer extensions (Ollama has no way to force a tool call): OpenAI's fields, OpenAI's shapes
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    format: str | dict[str, Any] | None = None
    options: Options = Field(default_factory=Options)
    stream: bool = True
    keep_alive: KeepAlive = None
    think: Think = None
    # Ollama drops the oldest messages of a conversation that does not fit (keeping the system
    # messages and the newest turn); `truncate: false` refuses it with a 400 instead
    truncate: bool | None = None
    logprobs: bool | None = None  # Ollama >= 0.12: each chunk carries its tokens' logprobs
    top_logprobs: int | None = None


class GenerateBody(WireModel):
    model: str = ""
    prompt: str = ""
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    raw: bool = False
    images: list[str] | None = None
    format: str | dict[str, Any] | None = None
    options: Options = Field(default_factory=Options)
    stream: bool = True
    keep_alive: KeepAlive = None
    think: Think = None
    context: list[int] | None = None
    truncate: bool | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None


class NameBody(WireModel):
    model: str | None = None
    name: str | None = None
    verbose: bool = False
    stream: bool = True
    insecure: bool = False

    def target(self) -> str:
        value = self.model or self.name
        if not value:
            raise InvalidRequest("model is required")
        return value


class CopyBody(WireModel):
    source: str
    destination: str


# ---- translation ------------------------------------------------------------------------------


def keep_alive_seconds(value: KeepAlive) -> float | None:
    if value is None or value == "":
        return None
    try:
        return parse_duration(value)
    except (ValueError, OverflowError) as exc:  # OverflowError: an integer too large for a float
        raise InvalidRequest(f"keep_alive: {exc}") from None


def think_fields(think: Think) -> tuple[bool | None, Any]:
    if think is None:
        return None, None
    if isinstance(think, bool):
        return think, None
    return True, THINK_LEVELS[think]  # "max" is the highest effort kinfer knows


def response_format(fmt: str | dict[str, Any] | None) -> ResponseFormat | None:
    """`format`: "json" (any JSON object) or a JSON schema; "" or absent: free text."""
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return ResponseFormat("json_object")
    if isinstance(fmt, dict):
        return ResponseFormat("json_schema", fmt)
    raise InvalidRequest('format: give "json" or a JSON schema object')


def check_images(images: list[str] | None) -> None:
    if images:
        raise InvalidRequest("images: this model reads text only")


def require_model(body: ChatBody | GenerateBody) -> None:
    """Ollama refuses a generation request without a model rather than guessing one."""
    if not body.model:
        raise InvalidRequest("model is required")


def tool_choice_name(choice: str | dict[str, Any] | None) -> str:
    """The kinfer extension `tool_choice`: "auto", "none", "required", or a function named as OpenAI
    names it ({"type": "function", "function": {"name": ...}}, or the flat {"name": ...})."""
    if choice is None:
        return "auto"
    if isinstance(choice, str):
        return tool_choice_mode(choice)
    function = choice.get("function")
    name = function.get("name") if isinstance(function, dict) else choice.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequest("tool_choice: give {'type': 'function', 'function': {'name': ...}}")
    return name


def common_fields(body: ChatBody | GenerateBody, request_id: str) -> dict[str, Any]:
    """The ChatRequest fields /api/chat and /api/generate fill the same way."""
    require_model(body)
    think, level = think_fields(body.think)
    return dict(
        model=body.model,
        sampling=replace(body.options.sampling(), logprobs=top_count(body.logprobs, body.top_logprobs)),
        max_tokens=body.options.max_tokens(),
        stop=body.options.stops(),
        think=think,
        think_level=level,
        keep_alive=keep_alive_seconds(body.keep_alive),
        num_ctx=body.options.num_ctx,
        truncation="error" if body.truncate is False else "drop_oldest",
        response_format=response_format(body.format),
        dialect="ollama",
        request_id=request_id,
        strict_capabilities=True,  # Ollama refuses thinking or tools the model cannot serve
    )


def to_chat_request(body: ChatBody, request_id: str) -> ChatRequest:
    messages = []
    for m in body.messages:
        check_images(m.images)
        calls = tuple(
            ToolCall(
                id=c.id or f"call_{uuid.uuid4().hex[:24]}",
                name=c.function.name,
                arguments=c.function.arguments,
            )
            for c in m.tool_calls or ()
        )
        messages.append(
            Message(
                role=m.role,
                content=m.content,
                thinking=m.thinking,
                tool_calls=calls,
                tool_call_id=m.tool_call_id,
                name=m.tool_name,
            )
        )
    tools = tuple(
        ToolSpec(t.function.name, t.function.description, t.function.parameters) for t in body.tools or ()
    )
    choice = tool_choice_name(body.tool_choice)
    return ChatRequest(
        messages=tuple(messages),
        tools=() if choice == "none" else tools,
        tool_choice=choice,
        parallel_tool_calls=body.parallel_tool_calls is not False,
        **common_fields(body, request_id),
    )


def to_generate_request(body: GenerateBody, request_id: str) -> ChatRequest:
    check_images(body.images)
    if body.suffix:
        raise InvalidRequest("suffix: fill-in-the-middle is not supported")
    common = common_fields(body, request_id)
    if body.raw:  # as in Ollama, a raw prompt is taken as it is: `context` does not apply
        return ChatRequest(raw_prompt=body.prompt, **common)
    # the reply carries prompt + reply as token ids, for the client to send back as `context`
    common.update(context=context_tokens(body.context), return_context=True)
    if body.template:
        prompt = render_go_template(body.template, system=body.system or "", prompt=body.prompt)
        return ChatRequest(raw_prompt=prompt, **common)
    messages = ((Message("system", body.system),) if body.system else ()) + (Message("user", body.prompt),)
    return ChatRequest(messages=messages, **common)


def context_tokens(context: list[int] | None) -> tuple[int, ...]:
    """An earlier reply's `context`: token ids the model reads back ahead of the new prompt."""
    if not context:
        return ()
    if not all(0 <= t <= MAX_TOKEN_ID for t in context):
        raise InvalidRequest("context: token ids are whole numbers from 0 up")
    return tuple(context)
