"""OpenAI Responses tools: function tools, `namespace` groups of them, and hosted tools kinfer cannot run.

Codex sends its MCP tools as namespaces: `{"type": "namespace", "name": "mcp__docs__", "tools":
[{"type": "function", "name": "search", ...}]}`. The model sees each inner function under one flat
name, Codex's own spelling of a namespaced tool (`mcp__docs__search`); a call to it goes back as a
`function_call` item with the two parts apart (`"namespace": "mcp__docs__", "name": "search"`), which
is how Codex routes it (a flat name alone is "unsupported call"). Replayed calls join them again.

Hosted tools (`web_search`, `file_search`, `code_interpreter`, ...) run on OpenAI's servers; kinfer
has nothing to run them with, so they are dropped, with one warning per tool type per server.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kinfer.protocol import ToolSpec

log = logging.getLogger(__name__)

NAMESPACE_DELIMITER = "__"


def flat_name(namespace: str, name: str) -> str:
    """The name the model calls a namespaced function by (Codex's `canonical_flat_name`)."""
    return f"{namespace.rstrip('_')}{NAMESPACE_DELIMITER}{name.lstrip('_')}"


@dataclass(frozen=True)
class ToolSet:
    """What the request's `tools` become.

    `specs`: the functions the model is told of. `namespaced`: flat name -> (namespace, name) for
    functions that came in a namespace. `echo`: the tools as the response object lists them.
    `dropped`: the types of the tools left out.
    """

    specs: tuple[ToolSpec, ...] = ()
    namespaced: dict[str, tuple[str, str]] = field(default_factory=dict)
    echo: tuple[dict[str, Any], ...] = ()
    dropped: tuple[str, ...] = ()

    def split(self, name: str) -> tuple[str | None, str]:
        """(namespace, name) of a function the model called; (None, name) for a plain function.

        A model may call a namespaced function by its inner name alone; that is taken when no plain
        function has the name and only one namespace has it."""
        if name in self.namespaced:
            return self.namespaced[name]
        if any(spec.name == name for spec in self.specs):
            return None, name
        owners = [pair for pair in self.namespaced.values() if pair[1].lstrip("_") == name.lstrip("_")]
        return owners[0] if len(owners) == 1 else (None, name)


def to_tools(wire: Iterable[Any] | None) -> ToolSet:
    """Function tools and the functions inside namespaces; every other tool type is dropped."""
    specs: list[ToolSpec] = []
    namespaced: dict[str, tuple[str, str]] = {}
    echo: list[dict[str, Any]] = []
    dropped: list[str] = []
    for tool in wire or ():
        if tool.type == "function" and tool.name:
            specs.append(_spec(tool, tool.name))
            echo.append(tool_json(tool))
        elif tool.type == "namespace" and tool.name:
            inner = []
            for child in tool.tools or ():
                if child.type != "function" or not child.name:
                    dropped.append(child.type)
                    continue
                name = flat_name(tool.name, child.name)
                specs.append(_spec(child, name))
                namespaced[name] = (tool.name, child.name)
                inner.append(tool_json(child))
            echo.append(
                {
                    "type": "namespace",
                    "name": tool.name,
                    "description": tool.description or "",
                    "tools": inner,
                }
            )
        else:
            dropped.append(tool.type)
    return ToolSet(tuple(specs), namespaced, tuple(echo), tuple(dropped))


def warn_dropped(seen: set[str], dropped: Iterable[str]) -> None:
    """One warning per tool type the server drops, not one per request (an agent sends them every turn)."""
    for kind in dropped:
        if kind not in seen:
            seen.add(kind)
            log.warning(
                "dropping %r tools: kinfer runs function tools only (logged once; later ones are dropped "
                "silently)",
                kind,
            )


def tool_json(tool: Any) -> dict[str, Any]:
    """A function tool as the response object echoes it."""
    return {
        "type": "function",
        "name": tool.name,
        "description": tool.description,
        "parameters": tool.parameters or {"type": "object"},
        "strict": bool(tool.strict),
    }


def _spec(tool: Any, name: str) -> ToolSpec:
    return ToolSpec(name, tool.description or "", tool.parameters or {"type": "object"})
