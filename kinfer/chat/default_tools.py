"""kinfer's own tool prompt, for chat templates that never read `tools` (SmolLM2's, the ChatML fallback).

Without it the tools would vanish from the prompt and the model would never hear of them. The
convention is Hermes, as Qwen2.5's template writes it: the tool list in the system turn, calls as
`<tool_call>{"name": ..., "arguments": ...}</tool_call>` in the assistant's text, results as
`<tool_response>` blocks in a user turn. The output side parses those calls as it parses any model's.

The conversation is rewritten before the template sees it, so the template stays the model's own:
it only ever meets system, user and assistant messages with plain text.
"""

from __future__ import annotations

import json
from typing import Any

from kinfer.protocol import Message, ToolCall

TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def tools_block(tools: list[dict[str, Any]]) -> str:
    """The system-turn text that lists `tools` (OpenAI-shaped dicts) and shows how to call them."""
    listed = "".join("\n" + json.dumps(tool, ensure_ascii=False) for tool in tools)
    return TOOLS_HEADER + listed + TOOLS_FOOTER


def call_text(call: ToolCall) -> str:
    """One earlier call as the model would have written it."""
    body = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def with_default_tool_prompt(
    messages: tuple[Message, ...], tools: list[dict[str, Any]]
) -> tuple[Message, ...]:
    """`messages` as a template without tool support can render them.

    The tool list joins the first system message (or becomes one); an assistant's calls are appended
    to its text; consecutive tool results become one user turn of `<tool_response>` blocks.
    """
    out: list[Message] = []
    after_tool = False  # the last message out holds tool results: the next result joins it
    for message in messages:
        if message.role == "tool":
            response = f"<tool_response>\n{message.content}\n</tool_response>"
            if after_tool:
                out[-1] = Message("user", out[-1].content + "\n" + response)
            else:
                out.append(Message("user", response))
            after_tool = True
            continue
        after_tool = False
        if message.role == "assistant" and message.tool_calls:
            parts = ([message.content] if message.content else []) + [
                call_text(c) for c in message.tool_calls
            ]
            out.append(Message("assistant", "\n".join(parts), thinking=message.thinking))
        else:
            out.append(message)
    if not tools:
        return tuple(out)
    block = tools_block(tools)
    if out and out[0].role == "system":
        first = out[0]
        out[0] = Message("system", f"{first.content}\n\n{block}" if first.content else block)
    else:
        out.insert(0, Message("system", block))
    return tuple(out)
