"""What a chat template tells us about the model's output: think markers and its tool-call format."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

from kinfer.chat.jinja_env import template_variables

ToolFormat = Literal["hermes", "qwen3_5_xml", "default", "none"]
TRAITS_CACHE_SIZE = 32

# Think-block markers seen in the wild, most common first; the first pair a template mentions wins.
THINK_MARKERS: tuple[tuple[str, str], ...] = (
    ("<think>", "</think>"),
    ("<seed:think>", "</seed:think>"),
    ("<longcat_think>", "</longcat_think>"),
)

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"


@dataclass(frozen=True)
class TemplateTraits:
    """How a template frames thinking and tool calls.

    `supports_thinking`: the template writes think blocks, so the model may open one.
    `has_think_switch`: the template reads `enable_thinking` (Qwen3 style), so it renders think mode itself.
    `tool_format`: how the model writes calls: Hermes JSON in `<tool_call>` (Qwen2.5/Qwen3), Qwen3.5 /
    Qwen3-Coder XML (`<tool_call><function=...><parameter=...>`), `default` when the template never
    reads `tools` (kinfer then writes the Hermes tool prompt itself, see `default_tools`), or `none`
    when the template prints tools in a convention kinfer cannot parse back (Llama 3's bare JSON).
    """

    supports_thinking: bool = False
    think_open: str = "<think>"
    think_close: str = "</think>"
    has_think_switch: bool = False
    tool_format: ToolFormat = "none"


@functools.lru_cache(maxsize=TRAITS_CACHE_SIZE)
def analyze_template(template: str | None) -> TemplateTraits:
    """Read a Jinja chat template's source for think markers, the think switch and the tool-call format.

    `None` (no template) describes kinfer's ChatML fallback: no thinking, the default tool prompt.
    """
    if template is None:
        return TemplateTraits(tool_format="default")
    think_open, think_close = THINK_MARKERS[0]
    supports_thinking = False
    for open_marker, close_marker in THINK_MARKERS:
        if open_marker in template:
            think_open, think_close, supports_thinking = open_marker, close_marker, True
            break
    return TemplateTraits(
        supports_thinking=supports_thinking,
        think_open=think_open,
        think_close=think_close,
        has_think_switch="enable_thinking" in template,
        tool_format=_tool_format(template),
    )


def _tool_format(template: str) -> ToolFormat:
    variables = template_variables(template)
    reads_tools = "tools" in variables if variables is not None else "tools" in template
    if not reads_tools:
        return "default"
    # the XML format is the only one whose instructions or replay spell out "<function="
    if TOOL_CALL_OPEN not in template:
        return "none"
    if "<function=" in template:
        return "qwen3_5_xml"
    return "hermes"
