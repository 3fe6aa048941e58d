"""The output side of one request: released text in, `Delta` / `ToolCallEvent` out.

The scheduler feeds it every piece of text the engine releases (after stop strings), in order.
Thinking is split off first, so a `<tool_call>` the model writes while thinking stays thinking;
only the answer goes through the tool-call parser, and only when the request offered tools.
"""

from __future__ import annotations

from kinfer.chat.thinking import ThinkSplitter
from kinfer.chat.tool_calls import ToolCallParser
from kinfer.chat.traits import TemplateTraits
from kinfer.protocol import Delta, ToolCallEvent, ToolSpec

Output = Delta | ToolCallEvent


class OutputPipeline:
    """Think splitting, then tool-call parsing, over a streamed reply.

    Tool calls are looked for in every tool format the parser knows, whatever `traits.tool_format`
    says: a template that teaches no format (SmolLM2's ChatML) gives no hint, and models stray.
    """

    def __init__(
        self, traits: TemplateTraits, *, starts_in_thinking: bool, tools: tuple[ToolSpec, ...] = ()
    ) -> None:
        self._splitter = (
            ThinkSplitter(traits.think_open, traits.think_close, starts_in_thinking=starts_in_thinking)
            if traits.supports_thinking or starts_in_thinking
            else None
        )
        self._tools = ToolCallParser(tools) if tools else None

    @property
    def tool_calls_seen(self) -> int:
        """How many tool calls have gone out so far (the finish reason is "tool_calls" when > 0)."""
        return self._tools.calls_seen if self._tools else 0

    def feed(self, text: str) -> list[Output]:
        """Take the next released piece of the reply."""
        if not text:
            return []
        pieces = self._splitter.feed(text) if self._splitter else [Delta(text)]
        return _merge(self._route(pieces))

    def finish(self) -> list[Output]:
        """The reply ended: release everything held back, in order."""
        pieces = self._splitter.finish() if self._splitter else []
        out = self._route(pieces)
        if self._tools:
            out.extend(self._tools.finish())
        return _merge(out)

    def _route(self, pieces: list[Delta]) -> list[Output]:
        out: list[Output] = []
        for piece in pieces:
            if piece.kind == "text" and self._tools is not None:
                out.extend(self._tools.feed(piece.text))
            else:
                out.append(piece)
        return out


def _merge(items: list[Output]) -> list[Output]:
    # one feed can yield several pieces of the same kind; clients are better served by one
    merged: list[Output] = []
    for item in items:
        last = merged[-1] if merged else None
        if isinstance(item, Delta) and isinstance(last, Delta) and last.kind == item.kind:
            merged[-1] = Delta(last.text + item.text, item.kind)
        elif not (isinstance(item, Delta) and not item.text):
            merged.append(item)
    return merged
