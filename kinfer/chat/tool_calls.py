"""Find tool calls in a streamed answer while it streams.

Prose goes out as soon as it cannot be the start of `<tool_call>`; a call goes out as one
`ToolCallEvent` the moment its `</tool_call>` arrives. A block that does not parse (bad JSON, no
name, never closed) goes out as the text it was, so nothing the model wrote is lost. Whitespace that
only separates prose from calls (or calls from each other) is dropped.
"""

from __future__ import annotations

import logging

from kinfer.chat.markers import partial_marker_length
from kinfer.chat.tool_formats import parse_call_body
from kinfer.chat.traits import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from kinfer.protocol import Delta, ToolCallEvent, ToolSpec

log = logging.getLogger(__name__)


class ToolCallParser:
    """Streaming parser for `<tool_call>` blocks (Hermes JSON or Qwen3.5 XML bodies) in answer text.

    `tools` are the request's tools; their schemas decide how XML parameter values are typed.
    """

    def __init__(self, tools: tuple[ToolSpec, ...] = ()) -> None:
        self._tools = tools
        self._buf = ""
        self._inside = False
        self._pending_ws = ""  # whitespace not yet known to be prose rather than a separator
        self._ws_before_call = ""  # put back if the call turns out malformed
        self._after_call = False  # the last thing out was a call
        self.calls_seen = 0

    def feed(self, text: str) -> list[Delta | ToolCallEvent]:
        """Take the next piece of answer text; return the text and calls that are certain now."""
        self._buf += text
        out: list[Delta | ToolCallEvent] = []
        while self._buf:
            if self._inside:
                if not self._take_call(out):
                    break
            elif not self._take_prose(out):
                break
        return out

    def finish(self) -> list[Delta | ToolCallEvent]:
        """The answer ended: a partial tag or an unterminated call is released as plain text."""
        out: list[Delta | ToolCallEvent] = []
        if self._inside:
            log.info("tool call never closed; returning it as text")
            self._pending_ws = self._ws_before_call
            self._emit_text(TOOL_CALL_OPEN + self._buf, out)
        elif self._buf:
            self._emit_text(self._buf, out)
        self._buf = ""
        self._inside = False
        if self._pending_ws and not self._after_call:
            out.append(Delta(self._pending_ws))
        self._pending_ws = ""
        return out

    def _take_prose(self, out: list[Delta | ToolCallEvent]) -> bool:
        at = self._buf.find(TOOL_CALL_OPEN)
        if at >= 0:
            self._emit_text(self._buf[:at], out)
            # whitespace right before a call only separates it (unless the call is malformed)
            self._ws_before_call, self._pending_ws = self._pending_ws, ""
            self._buf = self._buf[at + len(TOOL_CALL_OPEN) :]
            self._inside = True
            return True
        hold = partial_marker_length(self._buf, TOOL_CALL_OPEN)
        self._emit_text(self._buf[: len(self._buf) - hold], out)
        self._buf = self._buf[len(self._buf) - hold :]
        return False

    def _take_call(self, out: list[Delta | ToolCallEvent]) -> bool:
        at = self._buf.find(TOOL_CALL_CLOSE)
        if at < 0:
            return False
        body = self._buf[:at]
        self._buf = self._buf[at + len(TOOL_CALL_CLOSE) :]
        self._inside = False
        call = parse_call_body(body, self._tools)
        if call is None:
            log.info("malformed tool call left as text: %.200r", body)
            self._pending_ws = self._ws_before_call
            self._emit_text(TOOL_CALL_OPEN + body + TOOL_CALL_CLOSE, out)
            return True
        out.append(ToolCallEvent(call, self.calls_seen))
        self.calls_seen += 1
        self._pending_ws = ""
        self._after_call = True
        return True

    def _emit_text(self, text: str, out: list[Delta | ToolCallEvent]) -> None:
        if not text:
            return
        body = text.rstrip()
        if not body:
            self._pending_ws += text
            return
        out.append(Delta(self._pending_ws + body))
        self._pending_ws = text[len(body) :]
        self._after_call = False
