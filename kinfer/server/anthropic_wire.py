"""Anthropic Messages: wire schemas and their translation to a `ChatRequest`.

Content blocks map onto the internal messages the chat template reads: `tool_use` blocks become the
assistant's `tool_calls`, each `tool_result` block becomes a `tool` message (named after the call it
answers), `thinking` blocks become the assistant's `thinking`; `redacted_thinking` is dropped (we
cannot read it). A `system` message inside `messages` (Anthropic's mid-conversation system messages,
which Claude Code sends after the user's turn) stays a system message where it is; the chat template
decides how it is rendered (kinfer.chat.inline_system). Images and documents are refused with a 400:
kinfer serves text-only models.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from pydantic import Field

from kinfer.chat.volatile import strip_volatile_headers
from kinfer.errors import InvalidRequest
from kinfer.protocol import ChatRequest, Message, ResponseFormat, Sampling, ThinkLevel, ToolCall, ToolSpec
from kinfer.server.wire import WireModel, warn_dropped_tool

log = logging.getLogger(__name__)

MAX_STOP_SEQUENCES = 16
MIN_THINKING_BUDGET = 1024  # Anthropic's own floor for thinking.budget_tokens
BLOCK_SEPARATOR = "\n\n"  # between text blocks of one message (Claude Code sends reminders as own blocks)
MEDIA_BLOCKS = frozenset({"image", "document", "file", "container_upload"})
EFFORT_LEVELS: dict[str, ThinkLevel] = {
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
    "max": "high",
}


# ---- wire schemas ---------------------------------------------------------------------------


class ContentBlock(WireModel):
    """One content block of any type; which fields matter depends on `type`."""

    type: str
    text: str | None = None
    # tool_use
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    # tool_result
    tool_use_id: str | None = None
    content: str | list[ContentBlock] | None = None
    is_error: bool = False
    # thinking / redacted_thinking
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None


class WireMessage(WireModel):
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


class SystemBlock(WireModel):
    type: Literal["text"] = "text"
    text: str


class WireTool(WireModel):
    """A client tool (`type` absent or "custom"); server tools (web_search_..., bash_...) carry a type."""

    name: str
    type: str | None = None
    description: str = ""
    input_schema: dict[str, Any] | None = None


class ToolChoice(WireModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class ThinkingConfig(WireModel):
    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: int | None = None


class OutputFormat(WireModel):
    """Structured output: {"type": "json_schema", "schema": {...}} (the only type Anthropic defines)."""

    type: str
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")


class OutputConfig(WireModel):
    effort: str | None = None
    format: OutputFormat | None = None


class CountTokensBody(WireModel):
    """The fields `count_tokens` reads: everything that shapes the prompt."""

    model: str = ""
    messages: list[WireMessage]
    system: str | list[SystemBlock] | None = None
    tools: list[WireTool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None
    # the structured-outputs beta's spelling (header structured-outputs-2025-11-13); SDK 2.x sends
    # output_config.format instead
    output_format: OutputFormat | None = None


class MessagesBody(CountTokensBody):
    """`POST /v1/messages`. `max_tokens` and at least one message are required, as Anthropic requires."""

    messages: list[WireMessage] = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    stop_sequences: list[str] | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None

    def sampling(self) -> Sampling:
        return Sampling().given(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)

    def stops(self) -> tuple[str, ...]:
        stops = tuple(s for s in self.stop_sequences or () if s)
        if len(stops) > MAX_STOP_SEQUENCES:
            raise InvalidRequest(f"stop_sequences: at most {MAX_STOP_SEQUENCES} stop sequences")
        return stops


# ---- wire -> ChatRequest ----------------------------------------------------------------------


def tool_use_id(call_id: str) -> str:
    """Anthropic spells call ids `toolu_...`; ours are `call_...` (ids from the history pass through)."""
    if call_id.startswith("toolu_"):
        return call_id
    return "toolu_" + call_id.removeprefix("call_")


def system_text(system: str | list[SystemBlock] | None) -> str:
    """The system prompt without Claude Code's per-request `cch=` value (it would defeat the prefix cache)."""
    if system is None:
        return ""
    blocks = [system] if isinstance(system, str) else [b.text for b in system]
    texts = [strip_volatile_headers(t) for t in blocks]
    return BLOCK_SEPARATOR.join(t for t in texts if t)


def refuse_media(block: ContentBlock, where: str) -> None:
    if block.type in MEDIA_BLOCKS:
        raise InvalidRequest(
            f"{where}: content block of type {block.type!r}: kinfer serves text-only models; "
            "send text blocks only"
        )


def tool_result_text(block: ContentBlock, where: str) -> str:
    if block.content is None or isinstance(block.content, str):
        text = block.content or ""
    else:
        parts = []
        for inner in block.content:
            refuse_media(inner, where)
            if inner.type == "text":
                parts.append(inner.text or "")
            else:
                log.info("%s: skipping a %r block inside a tool_result", where, inner.type)
        text = BLOCK_SEPARATOR.join(parts)
    # the model has no is_error flag to read; say it in words, as Anthropic's own rendering does
    return f"Error: {text}" if block.is_error else text


def user_messages(blocks: list[ContentBlock], names: dict[str, str], where: str) -> list[Message]:
    """A user turn: its tool results become `tool` messages, its text a user message, in order."""
    out: list[Message] = []
    texts: list[str] = []

    def flush_text() -> None:
        if texts:
            out.append(Message("user", BLOCK_SEPARATOR.join(texts)))
            texts.clear()

    for i, block in enumerate(blocks):
        at = f"{where}.content.{i}"
        refuse_media(block, at)
        if block.type == "text":
            texts.append(block.text or "")
        elif block.type == "tool_result":
            if not block.tool_use_id:
                raise InvalidRequest(f"{at}.tool_use_id: Field required")
            flush_text()
            out.append(
                Message(
                    "tool",
                    tool_result_text(block, at),
                    tool_call_id=block.tool_use_id,
                    name=names.get(block.tool_use_id),
                )
            )
        elif block.type in ("thinking", "redacted_thinking"):
            continue
        else:
            raise InvalidRequest(f"{at}: content block of type {block.type!r} is not supported")
    flush_text()
    return out


def system_message(content: str | list[ContentBlock], where: str) -> Message:
    """A mid-conversation system message: a string or text blocks."""
    if isinstance(content, str):
        return Message("system", strip_volatile_headers(content))
    texts = []
    for i, block in enumerate(content):
        if block.type != "text":
            raise InvalidRequest(f"{where}.content.{i}: a system message holds text blocks only")
        texts.append(strip_volatile_headers(block.text or ""))
    return Message("system", BLOCK_SEPARATOR.join(t for t in texts if t))


def assistant_message(blocks: list[ContentBlock], names: dict[str, str], where: str) -> Message:
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[ToolCall] = []
    for i, block in enumerate(blocks):
        at = f"{where}.content.{i}"
        if block.type == "text":
            texts.append(block.text or "")
        elif block.type == "thinking":
            thinking.append(block.thinking or "")
        elif block.type == "redacted_thinking":
            continue  # encrypted by another provider; nothing a local model can read
        elif block.type == "tool_use":
            if not block.id or not block.name:
                raise InvalidRequest(f"{at}: a tool_use block needs an id and a name")
            names[block.id] = block.name
            calls.append(ToolCall(id=block.id, name=block.name, arguments=block.input or {}))
        else:
            refuse_media(block, at)
            raise InvalidRequest(f"{at}: content block of type {block.type!r} is not supported")
    return Message(
        "assistant",
        BLOCK_SEPARATOR.join(texts),
        thinking=BLOCK_SEPARATOR.join(thinking) if thinking else None,
        tool_calls=tuple(calls),
    )


def to_messages(system: str, wire: list[WireMessage]) -> tuple[Message, ...]:
    names: dict[str, str] = {}  # tool_use id -> tool name, for the tool messages that answer them
    messages = [Message("system", system)] if system else []
    for n, m in enumerate(wire):
        where = f"messages.{n}"
        if m.role == "system" and n == 0:
            # Anthropic's placement rule: the conversation opens with a user turn
            raise InvalidRequest(
                "messages.0.role: a system message cannot open the conversation; "
                "put instructions for the whole conversation in the top-level `system` field"
            )
        if m.role == "system":
            messages.append(system_message(m.content, where))
        elif isinstance(m.content, str):
            messages.append(Message(m.role, m.content))
        elif m.role == "assistant":
            messages.append(assistant_message(m.content, names, where))
        else:
            messages.extend(user_messages(m.content, names, where))
    return tuple(messages)


def to_tools(wire: list[WireTool] | None) -> tuple[ToolSpec, ...]:
    tools = []
    for tool in wire or ():
        if tool.type not in (None, "custom"):
            warn_dropped_tool("anthropic", str(tool.type))
            continue
        tools.append(ToolSpec(tool.name, tool.description, tool.input_schema or {"type": "object"}))
    return tuple(tools)


def tool_choice_name(choice: ToolChoice | None) -> str:
    if choice is None or choice.type == "auto":
        return "auto"
    if choice.type == "any":
        return "required"
    if choice.type == "none":
        return "none"
    if not choice.name:
        raise InvalidRequest("tool_choice.name: required when tool_choice.type is 'tool'")
    return choice.name


def think_from(thinking: ThinkingConfig | None, output: OutputConfig | None) -> tuple[bool | None, Any]:
    """`enabled` opens a think block, `disabled` renders the empty one, `adaptive` and `between_tools`
    (the model decides) leave the template's default; `output_config.effort` picks the level."""
    think = None if thinking is None else {"enabled": True, "disabled": False}.get(thinking.type)
    effort = output.effort if output is not None else None
    if think is False or effort is None:
        return think, None
    if effort not in EFFORT_LEVELS:
        raise InvalidRequest("output_config.effort must be one of low, medium, high, xhigh, max")
    return think, EFFORT_LEVELS[effort]


def check_thinking_budget(thinking: ThinkingConfig | None, max_tokens: int | None) -> None:
    """Anthropic's rules for an explicit budget: at least 1024 tokens, and less than `max_tokens`."""
    if thinking is None or thinking.type != "enabled" or thinking.budget_tokens is None:
        return
    if thinking.budget_tokens < MIN_THINKING_BUDGET:
        raise InvalidRequest(
            f"thinking.enabled.budget_tokens: Input should be greater than or equal to {MIN_THINKING_BUDGET}"
        )
    if max_tokens is not None and thinking.budget_tokens >= max_tokens:
        raise InvalidRequest("`max_tokens` must be greater than `thinking.budget_tokens`")


def response_format(wire: CountTokensBody) -> ResponseFormat | None:
    """`output_config.format` (or the beta's `output_format`) as the internal response format."""
    fmt = wire.output_config.format if wire.output_config is not None else None
    where = "output_config.format"
    if fmt is None and wire.output_format is not None:
        fmt, where = wire.output_format, "output_format"
    if fmt is None:
        return None
    if fmt.type != "json_schema":
        raise InvalidRequest(f"{where}.type: must be 'json_schema'")
    if fmt.schema_ is None:
        raise InvalidRequest(f"{where}.schema: Field required")
    return ResponseFormat("json_schema", fmt.schema_, strict=True)


def to_request(wire: CountTokensBody, request_id: str) -> ChatRequest:
    """The internal request for `wire` (a create body, or a count_tokens body without sampling)."""
    check_thinking_budget(wire.thinking, wire.max_tokens if isinstance(wire, MessagesBody) else None)
    think, level = think_from(wire.thinking, wire.output_config)
    choice = tool_choice_name(wire.tool_choice)
    tools = to_tools(wire.tools)
    extra: dict[str, Any] = {}
    if isinstance(wire, MessagesBody):
        extra = {"sampling": wire.sampling(), "max_tokens": wire.max_tokens, "stop": wire.stops()}
    return ChatRequest(
        model=wire.model,
        messages=to_messages(system_text(wire.system), wire.messages),
        tools=() if choice == "none" else tools,
        tool_choice=choice,
        parallel_tool_calls=not (wire.tool_choice is not None and wire.tool_choice.disable_parallel_tool_use),
        response_format=response_format(wire),
        think=think,
        think_level=level,
        dialect="anthropic",
        request_id=request_id,
        **extra,
    )
