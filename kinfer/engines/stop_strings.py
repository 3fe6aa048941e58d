"""Stop strings for streamed text: release text as soon as it cannot be the start of a stop string."""

from __future__ import annotations

import codecs
from dataclasses import dataclass


@dataclass(frozen=True)
class StopScan:
    """What `StopStringMatcher.feed` found: text safe to release now, and the stop string that matched."""

    text: str
    matched: str | None = None

    @property
    def stopped(self) -> bool:
        return self.matched is not None


class StopStringMatcher:
    """Holds back the tail of the reply that could still grow into a stop string.

    Engines run one per row over the raw generated text, before anything splits thinking from the
    answer, so a stop string ends the reply wherever it appears, inside a think block too. The matched
    stop string itself is never released, nor anything after it. When several match, the one that
    starts first wins (the longest, if they start together).
    """

    def __init__(self, stops: tuple[str, ...] | list[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._longest = max((len(s) for s in self._stops), default=0)
        self._pending = ""

    def feed(self, text: str) -> StopScan:
        if not self._stops:
            return StopScan(text)
        buffer = self._pending + text
        found = [(at, -len(stop), stop) for stop in self._stops if (at := buffer.find(stop)) >= 0]
        if found:
            at, _, stop = min(found)
            self._pending = ""
            return StopScan(buffer[:at], stop)
        hold = self._held_suffix_length(buffer)
        self._pending = buffer[len(buffer) - hold :]
        return StopScan(buffer[: len(buffer) - hold])

    def flush(self) -> str:
        """The held-back tail, released when the reply ends for another reason."""
        text, self._pending = self._pending, ""
        return text

    def _held_suffix_length(self, buffer: str) -> int:
        # longest suffix of buffer that is a proper prefix of some stop string
        for length in range(min(len(buffer), self._longest - 1), 0, -1):
            tail = buffer[-length:]
            if any(s.startswith(tail) for s in self._stops):
                return length
        return 0


class Utf8Decoder:
    """Joins token byte pieces into text, holding back an incomplete UTF-8 sequence.

    Bytes that can never be UTF-8 become U+FFFD at once; a character still unfinished when the reply
    ends (cut by max_tokens between the byte tokens of one character) is dropped, never shown as U+FFFD.
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, piece: bytes) -> str:
        return self._decoder.decode(piece)

    def flush(self) -> str:
        """The end of the reply: what is held back is half a character, so nothing is released."""
        self._decoder.reset()
        return ""
