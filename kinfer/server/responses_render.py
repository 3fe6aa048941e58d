"""OpenAI Responses: events -> output items, stream events and the response object.

One `OutputAssembler` serves streaming and non-streaming alike. Thinking becomes a `reasoning` item
(the thinking itself as its summary text, and as its `reasoning_text` content), answer text a
`message` item with one `output_text` part, each tool call a `function_call` item (a call to a function
of a `namespace` tool names the namespace apart, as Codex routes it).

`output_tokens_details.reasoning_tokens` is approximate: the count of thinking pieces the engine
released, which is one per decoding step (one token) except where a piece was held back and merged.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kinfer.protocol import Delta, Done, Event, TokenLogprob, ToolCallEvent, Usage
from kinfer.server.logprobs_wire import token_entries


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass(frozen=True)
class ResponseContext:
    """What the response object echoes of the request."""

    id: str
    model: str
    created_at: int
    instructions: str | None
    tools: tuple[dict[str, Any], ...]
    tool_choice: str | dict[str, Any]
    parallel_tool_calls: bool
    temperature: float | None
    top_p: float | None
    max_output_tokens: int | None
    previous_response_id: str | None
    reasoning: dict[str, Any]
    store: bool
    metadata: dict[str, Any]
    user: str | None = None
    truncation: str = "disabled"
    text: dict[str, Any] = field(default_factory=lambda: {"format": {"type": "text"}})


def usage_json(usage: Usage, reasoning_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": min(reasoning_tokens, usage.completion_tokens)},
        "total_tokens": usage.total_tokens,
    }


def response_json(
    ctx: ResponseContext,
    status: str,
    output: list[dict[str, Any]],
    *,
    usage: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
    incomplete_reason: str | None = None,
) -> dict[str, Any]:
    finished = status in ("completed", "incomplete", "failed")
    return {
        "id": ctx.id,
        "object": "response",
        "created_at": ctx.created_at,
        "completed_at": int(time.time()) if status == "completed" else None,
        "status": status,
        "background": False,
        "error": error,
        "incomplete_details": {"reason": incomplete_reason} if status == "incomplete" else None,
        "instructions": ctx.instructions,
        "max_output_tokens": ctx.max_output_tokens,
        "metadata": ctx.metadata,
        "model": ctx.model,
        "output": output,
        "parallel_tool_calls": ctx.parallel_tool_calls,
        "previous_response_id": ctx.previous_response_id,
        "reasoning": ctx.reasoning,
        "store": ctx.store,
        "temperature": ctx.temperature,
        "text": ctx.text,
        "tool_choice": ctx.tool_choice,
        "tools": list(ctx.tools),
        "top_p": ctx.top_p,
        "truncation": ctx.truncation,
        "usage": usage if finished else None,
        "user": ctx.user,
    }


class OutputAssembler:
    """Events in order -> Responses stream events (numbered), and the finished output items.

    `split` gives a called function's (namespace, name): (None, name) unless it came in a namespace.
    """

    def __init__(self, split: Callable[[str], tuple[str | None, str]] | None = None) -> None:
        self._split = split or (lambda name: (None, name))
        self.output: list[dict[str, Any]] = []
        self.texts: list[str] = []
        self.thinking: list[str] = []
        self.calls: list[Any] = []
        self.reasoning_pieces = 0
        self._open: dict[str, Any] | None = None
        self._text = ""  # the open item's text so far
        self._logprobs: list[dict[str, Any]] = []  # the open message's token logprobs, when asked for
        self._sequence = 0

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        """A stream event of type `kind` with the next sequence number."""
        data = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return data

    def feed(self, event: Event) -> list[dict[str, Any]]:
        if isinstance(event, Delta) and event.text:
            if event.kind == "thinking":
                self.reasoning_pieces += 1
                self.thinking.append(event.text)
                return self._reasoning_delta(event.text)
            self.texts.append(event.text)
            return self._text_delta(event.text, event.logprobs)
        if isinstance(event, ToolCallEvent):
            self.calls.append(event.call)
            return self._close() + self._function_call(event)
        return []

    def finish(self, item_status: str = "completed") -> list[dict[str, Any]]:
        """Close the open item (`incomplete` when the reply was cut short)."""
        return self._close(item_status)

    # ---- items ---------------------------------------------------------------------------

    def _add(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        self._open = item
        self.output.append(item)
        return [self.event("response.output_item.added", output_index=len(self.output) - 1, item=dict(item))]

    def _where(self) -> dict[str, Any]:
        assert self._open is not None
        return {"item_id": self._open["id"], "output_index": len(self.output) - 1}

    def _reasoning_delta(self, text: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self._open is None or self._open["type"] != "reasoning":
            out = self._close()
            out += self._add({"id": new_id("rs"), "type": "reasoning", "summary": []})
            part = {"type": "summary_text", "text": ""}
            out.append(
                self.event(
                    "response.reasoning_summary_part.added", **self._where(), summary_index=0, part=part
                )
            )
            self._text = ""
        self._text += text
        out.append(
            self.event("response.reasoning_summary_text.delta", **self._where(), summary_index=0, delta=text)
        )
        return out

    def _text_delta(self, text: str, records: tuple[TokenLogprob, ...] = ()) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self._open is None or self._open["type"] != "message":
            out = self._close()
            item = {
                "id": new_id("msg"),
                "type": "message",
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            }
            out += self._add(item)
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out.append(self.event("response.content_part.added", **self._where(), content_index=0, part=part))
            self._text = ""
            self._logprobs = []
        self._text += text
        logprobs = token_entries(records)
        self._logprobs += logprobs
        out.append(
            self.event(
                "response.output_text.delta", **self._where(), content_index=0, delta=text, logprobs=logprobs
            )
        )
        return out

    def _function_call(self, event: ToolCallEvent) -> list[dict[str, Any]]:
        call = event.call
        arguments = json.dumps(call.arguments, ensure_ascii=False)
        namespace, name = self._split(call.name)
        item = {
            "id": new_id("fc"),
            "type": "function_call",
            "status": "in_progress",
            "call_id": call.id,
            "name": name,
            "arguments": "",
        }
        if namespace is not None:
            item["namespace"] = namespace
        out = self._add(item)
        where = self._where()
        out.append(self.event("response.function_call_arguments.delta", **where, delta=arguments))
        out.append(
            self.event("response.function_call_arguments.done", **where, name=name, arguments=arguments)
        )
        item.update(status="completed", arguments=arguments)
        out.append(
            self.event("response.output_item.done", output_index=where["output_index"], item=dict(item))
        )
        self._open = None
        return out

    def _close(self, status: str = "completed") -> list[dict[str, Any]]:
        item = self._open
        if item is None:
            return []
        where = self._where()
        text, self._text = self._text, ""
        out: list[dict[str, Any]] = []
        if item["type"] == "reasoning":
            part = {"type": "summary_text", "text": text}
            out.append(
                self.event("response.reasoning_summary_text.done", **where, summary_index=0, text=text)
            )
            out.append(
                self.event("response.reasoning_summary_part.done", **where, summary_index=0, part=part)
            )
            item["summary"] = [part]
            item["content"] = [{"type": "reasoning_text", "text": text}]
        elif item["type"] == "message":
            logprobs, self._logprobs = self._logprobs, []
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}
            out.append(
                self.event(
                    "response.output_text.done", **where, content_index=0, text=text, logprobs=logprobs
                )
            )
            out.append(self.event("response.content_part.done", **where, content_index=0, part=part))
            item["content"] = [part]
            item["status"] = status
        out.append(
            self.event("response.output_item.done", output_index=where["output_index"], item=dict(item))
        )
        self._open = None
        return out


def finish_status(done: Done) -> tuple[str, str | None]:
    """(response status, incomplete reason) for how the reply ended."""
    if done.reason in ("length", "deadline"):
        return "incomplete", "max_output_tokens"
    if done.reason == "cancelled":
        return "incomplete", None
    return "completed", None
