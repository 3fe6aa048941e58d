"""Split a streamed reply into thinking and answer at the `<think>` / `</think>` markers.

Works on text pieces of any size: a marker may arrive split across pieces at any point, and only
what could still be the start of a marker (or whitespace that may turn out to border one) is held back.
Whitespace is trimmed the way Ollama's thinking parser trims it: after the opener, before and after
the closer. Everything else comes out exactly once, in order.
"""

from __future__ import annotations

import enum

from kinfer.chat.markers import partial_marker_length
from kinfer.protocol import Delta


class _State(enum.Enum):
    LOOKING = "looking"  # reply start: a model may open its own think block here
    THINK_START = "think_start"  # just inside a think block: eat whitespace
    THINKING = "thinking"
    ANSWER_START = "answer_start"  # just after the closer: eat whitespace
    ANSWER = "answer"


class ThinkSplitter:
    """Streaming splitter: `feed` pieces as they come, `finish` once at the end.

    `starts_in_thinking`: the prompt already opened the block (it ends in `<think>\\n`); a model that
    opens it again anyway is handled, as is one that opens it itself at the start of its reply.
    """

    def __init__(
        self, open: str = "<think>", close: str = "</think>", starts_in_thinking: bool = False
    ) -> None:
        self._open = open
        self._close = close
        self._state = _State.THINK_START if starts_in_thinking else _State.LOOKING
        self._may_reopen = starts_in_thinking
        self._buf = ""

    @property
    def in_thinking(self) -> bool:
        """Whether text fed now would be thinking."""
        return self._state in (_State.THINK_START, _State.THINKING)

    def feed(self, text: str) -> list[Delta]:
        """Take the next piece of the reply; return the deltas that are certain now."""
        self._buf += text
        out: list[Delta] = []
        while self._buf and self._step(out):
            pass
        return out

    def finish(self) -> list[Delta]:
        """The reply ended: release whatever was held back."""
        held, self._buf = self._buf, ""
        if not held:
            return []
        if self._state is _State.LOOKING:
            return [Delta(held, "text")]
        if self._state is _State.THINK_START:
            return [Delta(held, "thinking")] if held.strip() else []
        if self._state is _State.THINKING:
            # held = trailing whitespace + maybe the start of the closer; whitespace alone is trimmed
            return [Delta(held, "thinking")] if held.strip() else []
        if self._state is _State.ANSWER:
            return [Delta(held, "text")]
        return []

    def _step(self, out: list[Delta]) -> bool:
        """Consume what can be decided from the buffer; True if another step may make progress."""
        state = self._state
        if state is _State.LOOKING:
            stripped = self._buf.lstrip()
            if stripped.startswith(self._open):
                self._buf = stripped[len(self._open) :]
                self._state = _State.THINK_START
                return True
            if self._open.startswith(stripped):
                return False  # only whitespace or a partial opener so far
            self._state = _State.ANSWER
            return True
        if state is _State.THINK_START:
            stripped = self._buf.lstrip()
            self._buf = stripped
            if not stripped:
                return False
            if self._may_reopen:
                if stripped.startswith(self._open):
                    self._buf = stripped[len(self._open) :]
                    self._may_reopen = False
                    return True
                if self._open.startswith(stripped):
                    return False
            self._may_reopen = False
            self._state = _State.THINKING
            return True
        if state is _State.THINKING:
            at = self._buf.find(self._close)
            if at >= 0:
                thinking = self._buf[:at].rstrip()
                if thinking:
                    out.append(Delta(thinking, "thinking"))
                self._buf = self._buf[at + len(self._close) :]
                self._state = _State.ANSWER_START
                return True
            hold = partial_marker_length(self._buf, self._close)
            body = self._buf[: len(self._buf) - hold]
            # trailing whitespace may turn out to sit right before the closer: hold it too
            keep = body.rstrip()
            if keep:
                out.append(Delta(keep, "thinking"))
            self._buf = self._buf[len(keep) :]
            return False
        if state is _State.ANSWER_START:
            self._buf = self._buf.lstrip()
            if self._buf:
                self._state = _State.ANSWER
                return True
            return False
        out.append(Delta(self._buf, "text"))
        self._buf = ""
        return False
