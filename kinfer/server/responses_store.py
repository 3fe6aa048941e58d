"""Stored responses for `previous_response_id` and `GET /v1/responses/{id}`: a bounded LRU in memory.

Each entry keeps the response object as sent and the conversation it ended (every message but the
instructions, which OpenAI does not carry over to the next response), so a follow-up request needs
only its new input. The app holds one (see `responses.response_store`), so it goes away with the
server, as documented.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from kinfer.protocol import Message

DEFAULT_CAPACITY = 1000


@dataclass(frozen=True)
class StoredResponse:
    body: dict[str, Any]
    conversation: tuple[Message, ...]


class ResponseStore:
    """Least recently used responses, at most `capacity` of them. Used from the event loop only."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def put(self, response_id: str, entry: StoredResponse) -> None:
        self._entries[response_id] = entry
        self._entries.move_to_end(response_id)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    def delete(self, response_id: str) -> bool:
        return self._entries.pop(response_id, None) is not None

    def __len__(self) -> int:
        return len(self._entries)
