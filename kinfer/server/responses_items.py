"""OpenAI Responses input items: `item_reference`s resolved, ids given, and listed a page at a time.

A stored response keeps the items of its `input` (each with an id: the client's, or one made here)
for `GET /v1/responses/{id}/input_items`. An `item_reference` input item names an item by id; it is
looked up among every stored response's input and output items and taken in its place.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kinfer.errors import InvalidRequest
from kinfer.server.responses_wire import InputItem

DEFAULT_PAGE = 20
MAX_PAGE = 100
ID_PREFIXES = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
}

ItemFinder = Callable[[str], dict[str, Any] | None]


def resolve_references(items: str | list[InputItem], find: ItemFinder) -> str | list[InputItem]:
    """`items` with each `item_reference` replaced by the stored item it names (400 if none does)."""
    if isinstance(items, str):
        return items
    out = []
    for i, item in enumerate(items):
        if item.type != "item_reference":
            out.append(item)
            continue
        found = find(item.id) if item.id else None
        if found is None:
            raise InvalidRequest(
                f"input.{i}: no stored item with id {item.id!r} (items are kept with the response "
                "that holds them, while it is stored)"
            )
        out.append(InputItem.model_validate(found))
    return out


def input_item_records(items: str | list[InputItem], new_id: Callable[[str], str]) -> list[dict[str, Any]]:
    """The input as the items `input_items` lists: each with an id, messages with content parts."""
    if isinstance(items, str):
        items = [InputItem(type="message", role="user", content=items)]
    records = []
    for item in items:
        kind = item.type or "message"
        record = item.model_dump(exclude_none=True)
        record["type"] = kind
        record["id"] = item.id or new_id(ID_PREFIXES.get(kind, "item"))
        if kind == "message":
            part = "output_text" if item.role == "assistant" else "input_text"
            if isinstance(item.content, str):
                record["content"] = [{"type": part, "text": item.content}]
            record.setdefault("status", "completed")
        records.append(record)
    return records


def list_page(
    items: list[dict[str, Any]], *, after: str | None, limit: int | None, order: str | None
) -> dict[str, Any]:
    """OpenAI's list object over `items` (in input order): newest first unless `order=asc`."""
    if order not in (None, "asc", "desc"):
        raise InvalidRequest("order must be 'asc' or 'desc'")
    size = DEFAULT_PAGE if limit is None else limit
    if not 1 <= size <= MAX_PAGE:
        raise InvalidRequest(f"limit must be between 1 and {MAX_PAGE}")
    ordered = items if order == "asc" else list(reversed(items))
    if after is not None:
        ids = [item["id"] for item in ordered]
        if after not in ids:
            raise InvalidRequest(f"after: no item {after!r} in this response's input")
        ordered = ordered[ids.index(after) + 1 :]
    page = ordered[:size]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(ordered) > size,
    }
