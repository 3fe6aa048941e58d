"""How deeply nested JSON kinfer takes in: a client's body (tool schemas, tool-call arguments) or a
tool call a model wrote.

Python walks nested data recursively: the chat template's `tojson`, pydantic, `json.dumps` of a
reply. A tool schema 600 levels deep passed the parser and then failed each of those with
"maximum recursion depth exceeded" (a 500). Real schemas are a few levels deep; `MAX_JSON_DEPTH`
leaves room for any of them and refuses the rest where the data comes in.
"""

from __future__ import annotations

from typing import Any

MAX_JSON_DEPTH = 100


def nesting_depth(value: Any, limit: int = MAX_JSON_DEPTH) -> int:
    """How many arrays and objects deep `value` goes (a scalar is 0); stops counting past `limit`.

    Iterative, so it cannot itself run out of stack.
    """
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        depth += 1
        if depth > deepest:
            deepest = depth
            if deepest > limit:
                return deepest
        stack.extend((child, depth) for child in children if isinstance(child, dict | list | tuple))
    return deepest


def too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    return nesting_depth(value, limit) > limit
