"""Shared data and helpers for the chat tests: real templates, tools, a conversation, stream helpers."""

from __future__ import annotations

from pathlib import Path

from kinfer.protocol import Delta, Message, ToolCall, ToolCallEvent, ToolSpec

TEMPLATES = Path(__file__).resolve().parent.parent / "fixtures" / "templates"

# file name -> where it came from (all verbatim)
TEMPLATE_FILES = {
    "qwen3-0.6b.jinja": "Qwen/Qwen3-0.6B tokenizer_config.json chat_template (llama.cpp models/templates)",
    "qwen3.5-4b.jinja": "Qwen/Qwen3.5-4B chat_template.jinja (llama.cpp models/templates)",
    "qwen3-coder.jinja": "Qwen3-Coder chat template (llama.cpp models/templates/Qwen3-Coder.jinja)",
    "llama-3.2-3b-instruct.jinja": "meta-llama/Llama-3.2-3B-Instruct (llama.cpp models/templates)",
    "qwen3-4b-thinking-2507.jinja": "Qwen3-4B-Thinking-2507 tokenizer_config.json chat_template",
    "smollm2-135m-instruct.jinja": "SmolLM2-135M-Instruct GGUF metadata tokenizer.chat_template",
}


def load_template(name: str) -> str:
    return (TEMPLATES / name).read_text(encoding="utf-8")


WEATHER = ToolSpec(
    name="get_weather",
    description="Get the current weather for a city.",
    parameters={
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "City name"},
            "days": {"type": "integer", "description": "How many days ahead"},
            "units": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city"],
    },
)
SEARCH = ToolSpec(
    name="search",
    description="Search the web.",
    parameters={
        "type": "object",
        "properties": {
            "query": {"type": "string"},
            "filters": {"type": "object"},
            "limit": {"type": "number"},
        },
        "required": ["query"],
    },
)
TOOLS = (WEATHER, SEARCH)

# A full agent turn: question, a call (with its thinking), the result, the answer, a follow-up.
CONVERSATION = (
    Message("system", "You are a terse assistant."),
    Message("user", "What's the weather in Paris?"),
    Message(
        "assistant",
        "",
        thinking="The user wants the weather. I should call get_weather.",
        tool_calls=(ToolCall("call_0001", "get_weather", {"city": "Paris", "days": 1}),),
    ),
    Message("tool", '{"temperature": 21, "sky": "clear"}', tool_call_id="call_0001", name="get_weather"),
    Message("assistant", "It is 21 °C and clear in Paris.", thinking="Report the result."),
    Message("user", "And in Tokyo?"),
)


def collapse(events: list) -> list:
    """Join neighbouring deltas of the same kind, so differently chunked replies compare equal."""
    out: list = []
    for event in events:
        if isinstance(event, Delta) and out and isinstance(out[-1], Delta) and out[-1].kind == event.kind:
            out[-1] = Delta(out[-1].text + event.text, event.kind)
        elif not (isinstance(event, Delta) and not event.text):
            out.append(event)
    return out


def comparable(events: list) -> list:
    """Events with call ids blanked (ids are random), for comparing two runs."""
    return [blank_id(e) if isinstance(e, ToolCallEvent) else e for e in collapse(events)]


def blank_id(event: ToolCallEvent) -> ToolCallEvent:
    """The same call with its (random) id blanked."""
    return ToolCallEvent(ToolCall("", event.call.name, event.call.arguments), event.index)


def feed_all(parser, chunks: list[str]) -> list:
    """Feed chunks in order, then finish: everything the parser emitted."""
    events: list = []
    for chunk in chunks:
        events.extend(parser.feed(chunk))
    events.extend(parser.finish())
    return events


def splits(text: str):
    """Every way to cut `text` in two, plus one character at a time."""
    for at in range(len(text) + 1):
        yield [text[:at], text[at:]]
    yield list(text)
