"""Model-facing text: chat templates, think mode, the streaming think splitter, tool-call parsing.

Input side: `render_prompt` (Jinja chat templates, sandboxed), `render_go_template` (Ollama's
`template` field), `strip_volatile_headers`. Output side: `OutputPipeline`, built from the
`TemplateTraits` and `starts_in_thinking` that `render_prompt` returns.
"""

from __future__ import annotations

from kinfer.chat.go_template import render_go_template
from kinfer.chat.pipeline import OutputPipeline
from kinfer.chat.template import CHATML_TEMPLATE, RenderedPrompt, render_prompt
from kinfer.chat.thinking import ThinkSplitter
from kinfer.chat.tool_calls import ToolCallParser
from kinfer.chat.traits import TemplateTraits, analyze_template
from kinfer.chat.volatile import strip_volatile_headers

__all__ = [
    "CHATML_TEMPLATE",
    "OutputPipeline",
    "RenderedPrompt",
    "TemplateTraits",
    "ThinkSplitter",
    "ToolCallParser",
    "analyze_template",
    "render_go_template",
    "render_prompt",
    "strip_volatile_headers",
]
