"""Stored responses for `previous_response_id` and `GET /v1/responses/{id}`: a bounded LRU in memory.

Each entry keeps the response object as sent and the conversation it ended (every message but the
instructions, which OpenAI does not carry over to the next response), so a follow-up request needs
only its new input, and the items of its input, for `input_items`. Every input and output item can
be found by its id while its response is kept (`item_reference`). The app holds one (see
`responses.response_store`), so it goes away with the server, as documented.
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
    input_items: tuple[dict[str, Any], ...] = ()

    def items(self) -> list[dict[str, Any]]:
        """Its input items, then its output items."""
        return [*self.input_items, *self.body.get("output", ())]


class ResponseStore:
    """Least recently used responses, at most `capacity` of them. Used from the event loop only."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._items: dict[str, dict[str, Any]] = {}  # item id -> the item, over every entry

    def put(self, response_id: str, entry: StoredResponse) -> None:
        self._forget(self._entries.get(response_id))
        self._entries[response_id] = entry
        self._entries.move_to_end(response_id)
        for item in entry.items():
            if isinstance(item.get("id"), str):
                self._items[item["id"]] = item
        while len(self._entries) > self.capacity:
            self._forget(self._entries.popitem(last=False)[1])

    def find_item(self, item_id: str) -> dict[str, Any] | None:
        """An input or output item of any stored response, by its id."""
        return self._items.get(item_id)

    def get(self, response_id: str) -> StoredResponse | None:
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    def delete(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        self._forget(entry)
        return entry is not None

    def _forget(self, entry: StoredResponse | None) -> None:
        # an id a later response stored again points at that one's item: leave it
        for item in entry.items() if entry is not None else ():
            if self._items.get(item.get("id")) is item:
                del self._items[item["id"]]

    def __len__(self) -> int:
        return len(self._entries)
