"""What a constrained reply must follow, as the engines receive it (no grammar engine imported here)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ConstraintKind = Literal["json", "tool_call", "json_or_tool_call"]


@dataclass(frozen=True)
class Constraint:
    """A grammar in llguidance's Lark syntax, and where in the reply it starts.

    `start_after`: the grammar waits until the reply has written this marker (the think block's
    closer when the prompt opened one: thinking stays free); None = from the first token.
    `trigger`: a lazy grammar: after `start_after`, the reply is free until it writes this marker
    (the tool-call opener), and from the marker on it must follow the grammar, which starts with it.
    `think`: (opener, closer) when the reply may open a think block of its own (the template allows
    thinking but the prompt did not open the block); a lazy grammar skips such a block.
    Once the grammar is complete the reply ends (finish reason "stop").
    """

    grammar: str
    kind: ConstraintKind
    start_after: str | None = None
    trigger: str | None = None
    think: tuple[str, str] | None = None
