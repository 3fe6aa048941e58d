"""Turn a `ChatRequest` into the prompt text the model reads, with the model's own chat template.

The template is rendered the way transformers' `apply_chat_template` renders it (see `jinja_env`),
then think mode is applied as Ollama does: asked -> the prompt ends in the think opener, refused -> the
empty think block. Offsets worth keeping as exact prefix-cache points come along with the text.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from kinfer.chat.default_tools import with_default_tool_prompt
from kinfer.chat.inline_system import fold_inline_system, inline_system_messages
from kinfer.chat.jinja_env import render_template
from kinfer.chat.traits import TemplateTraits, analyze_template
from kinfer.errors import InvalidRequest
from kinfer.protocol import ChatRequest, Message, ToolSpec

log = logging.getLogger(__name__)

# ChatML, used only when the model carries no template. It never reads `tools`: kinfer's default tool
# prompt (Hermes, see default_tools) teaches a small model to call tools the parser understands.
CHATML_TEMPLATE = """\
{%- for message in messages %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""


@dataclass(frozen=True)
class RenderedPrompt:
    """The prompt text and what the output side needs to know about it.

    `starts_in_thinking`: the prompt ends inside an open think block, so the reply begins as thinking.
    `checkpoints`: character offsets into `text` where the prompt of a later turn is likely to agree
    exactly (end of the system prompt; end of the conversation before the newest user turn).
    """

    text: str
    starts_in_thinking: bool
    checkpoints: tuple[int, ...]
    traits: TemplateTraits


def render_prompt(
    template: str | None,
    request: ChatRequest,
    *,
    bos_token: str,
    eos_token: str,
    name: str | None = None,
) -> RenderedPrompt:
    """Render `request` with the model's Jinja chat `template` (ChatML when it is None).

    `request.raw_prompt`, when set, is the prompt verbatim. `name` (the model's name) labels template
    errors. Raises `InvalidRequest` for a template that fails, refuses the conversation
    (`raise_exception`) or tries to leave the sandbox.
    """
    traits = analyze_template(template)
    if request.raw_prompt is not None:
        raw = request.raw_prompt
        return RenderedPrompt(raw, _ends_in_open_think(raw, traits), (), traits)

    source = template if template is not None else CHATML_TEMPLATE
    label = f"the chat template of {name}" if name else "the chat template"
    tools = [tool_to_hf(t) for t in request.tools]
    conversation = request.messages
    if traits.tool_format == "default":
        # the template would drop the tools and the calls: kinfer writes them in the Hermes way
        conversation, tools = with_default_tool_prompt(conversation, tools), []
    variables: dict[str, Any] = {
        "bos_token": bos_token,
        "eos_token": eos_token,
        "tools": tools or None,
        # transformers passes documents=None too, so `documents is defined` reads the same here
        "documents": None,
    }
    if request.think is not None or request.think_level is not None:
        variables["enable_thinking"] = request.think is not False
        if request.think_level is not None and request.think is not False:
            variables["reasoning_effort"] = request.think_level

    def render(msgs: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        return render_template(
            source,
            {**variables, "messages": msgs, "add_generation_prompt": add_generation_prompt},
            label=label,
        )

    messages, text = _place_inline_system(conversation, render, label)
    # The generation prompt is what the full render adds to the bare conversation; think markers are
    # looked for only there, so a "<think>" quoted in an old message cannot flip the mode.
    base = _try_render(render, messages)
    prompt_tail_at = len(base) if base is not None and text.startswith(base) else 0
    text = _apply_think_mode(text, prompt_tail_at, request, traits)
    starts_in_thinking = _ends_in_open_think(text[prompt_tail_at:], traits)
    return RenderedPrompt(text, starts_in_thinking, _checkpoints(text, messages, render), traits)


def _place_inline_system(
    messages: tuple[Message, ...], render: Any, label: str
) -> tuple[list[dict[str, Any]], str]:
    """The messages for the template, and their rendering with the generation prompt: system messages
    after the first turn stay where they are if the template renders them there, and are folded into
    user turns if it refuses or drops them."""
    inline = inline_system_messages(messages)
    kept = [message_to_hf(m) for m in messages]
    if not inline:
        return kept, render(kept, True)
    try:
        text = render(kept, True)
    except InvalidRequest as exc:
        reason = str(exc)
    else:
        if all(m.content.strip() in text for m in inline):
            return kept, text
        reason = "it leaves them out"
    log.debug("%s cannot take system messages after the first turn (%s): folding them", label, reason)
    folded = [message_to_hf(m) for m in fold_inline_system(messages)]
    return folded, render(folded, True)


def message_to_hf(message: Message) -> dict[str, Any]:
    """One message as the dict Hugging Face templates read. Keys with no value are left out, because
    templates test `'tool_calls' in message` or `message.reasoning_content is defined`."""
    hf: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.thinking is not None and message.role == "assistant":
        # Qwen templates read reasoning_content; gpt-oss templates read thinking (transformers sets both)
        hf["reasoning_content"] = message.thinking
        hf["thinking"] = message.thinking
    if message.tool_calls:
        hf["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": _plain(call.arguments)},
                # some templates read tool_call.name / tool_call.arguments directly
                "name": call.name,
                "arguments": _plain(call.arguments),
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        hf["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        hf["name"] = message.name
    return hf


def tool_to_hf(tool: ToolSpec) -> dict[str, Any]:
    """A tool in the OpenAI shape templates print with `tool | tojson`."""
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": _plain(tool.parameters),
        },
    }


def _plain(value: Any) -> Any:
    # Only JSON types reach the template: a rich object's methods are attack surface the sandbox
    # does not know about (transformers' _plain_template_data does the same).
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool | int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return f"<{type(value).__name__}>"


def _try_render(render: Any, messages: list[dict[str, Any]]) -> str | None:
    # a truncated conversation may be one the template refuses (Qwen3.5: "No user query found")
    try:
        return render(messages, False)
    except InvalidRequest as exc:
        log.debug("no prefix render for %d messages: %s", len(messages), exc)
        return None


def _system_prefix_by_probe(render: Any, system: list[dict[str, Any]]) -> str | None:
    """For templates that refuse a system-only conversation (Qwen3.5): render it with two different
    one-word user turns; what the two share is the system prompt (and tools) plus the user header."""
    first, second = (
        _try_render(render, [*system, {"role": "user", "content": word}]) for word in ("\ue000", "\ue001")
    )
    if first is None or second is None:
        return None
    shared = next((i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b), 0)
    return first[:shared] or None


def _apply_think_mode(text: str, tail_at: int, request: ChatRequest, traits: TemplateTraits) -> str:
    """Make the prompt's end agree with the think mode asked for, as Ollama does."""
    if not traits.supports_thinking:
        return text
    asked = request.think is True or (request.think is None and request.think_level is not None)
    is_open = _ends_in_open_think(text[tail_at:], traits)
    if asked and not is_open:
        return text + traits.think_open + "\n"
    if request.think is False:
        if is_open:
            # the template opens a block unconditionally: close it empty
            return text + ("\n" if text.endswith("\n") else "\n\n") + traits.think_close + "\n\n"
        if not traits.has_think_switch:
            return text + f"{traits.think_open}\n\n{traits.think_close}\n\n"
    return text


def _ends_in_open_think(text: str, traits: TemplateTraits) -> bool:
    if not traits.supports_thinking:
        return False
    return text.rfind(traits.think_open) > text.rfind(traits.think_close)


def _checkpoints(text: str, messages: list[dict[str, Any]], render: Any) -> tuple[int, ...]:
    """Offsets of the system prompt's end and of the conversation before the newest user turn.

    Each is found by rendering the truncated conversation, and kept only if that render is an exact
    prefix of `text` (templates that rewrite old turns, like Qwen3 dropping past thinking, fail this).
    A template that refuses to render the system prompt alone is probed with a stand-in user turn.
    """
    n_system = 0
    while n_system < len(messages) and messages[n_system]["role"] == "system":
        n_system += 1
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
    cuts = {n_system} if n_system else set()
    if last_user > 0:
        cuts.add(last_user)
    offsets = set()
    for cut in sorted(cuts):
        prefix = _try_render(render, messages[:cut])
        if prefix is None and cut == n_system:
            prefix = _system_prefix_by_probe(render, messages[:cut])
        if prefix and len(prefix) < len(text) and text.startswith(prefix):
            offsets.add(len(prefix))
    return tuple(sorted(offsets))
