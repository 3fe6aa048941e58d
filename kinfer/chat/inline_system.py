"""System messages after the conversation has begun: where the chat template cannot take them.

Claude Code sends a `role: "system"` entry after the user's turn on every request (Anthropic's
mid-conversation system messages), and OpenAI clients may send a system message anywhere. Most
templates render any role as its own turn, and then the message is kept where it is, as a system
turn. Some refuse it (Qwen3.5: "System message must be at the beginning.") or print only the first
system message and drop the rest; for those it is folded into the neighbouring user turn instead,
as vLLM's Anthropic endpoint does (vllm/entrypoints/anthropic/inline_system.py):

- after a user turn (or a tool result), its text is appended to that turn;
- after an assistant turn, it opens the next user turn, or becomes one if none follows;
- between a tool call and its results, it waits until after the results;
- system messages before the first turn join the system prompt.

Folded text is wrapped in `<system-reminder>` tags, the way Claude Code itself marks system text it
puts in a user turn, so the model can still tell an instruction from the user's words. Only the end
of the conversation changes, so a conversation's next turn renders as an extension of this one and
the prefix cache keeps working.
"""

from __future__ import annotations

from dataclasses import replace

from kinfer.protocol import Message

REMINDER_OPEN = "<system-reminder>"
REMINDER_CLOSE = "</system-reminder>"
SEPARATOR = "\n\n"


def leading_system_count(messages: tuple[Message, ...]) -> int:
    count = 0
    while count < len(messages) and messages[count].role == "system":
        count += 1
    return count


def inline_system_messages(messages: tuple[Message, ...]) -> list[Message]:
    """The system messages that come after the conversation's first user, assistant or tool message."""
    return [m for m in messages[leading_system_count(messages) :] if m.role == "system"]


def as_reminder(text: str) -> str:
    text = text.strip()
    if text.startswith(REMINDER_OPEN):
        return text
    return f"{REMINDER_OPEN}\n{text}\n{REMINDER_CLOSE}"


def _join(*texts: str) -> str:
    return SEPARATOR.join(t for t in texts if t)


def fold_inline_system(messages: tuple[Message, ...]) -> tuple[Message, ...]:
    """`messages` with a single leading system message and every later one folded into a user turn."""
    lead = leading_system_count(messages)
    out: list[Message] = []
    if lead == 1:
        out.append(messages[0])
    elif lead > 1:
        out.append(Message("system", _join(*(m.content for m in messages[:lead]))))
    pending: list[str] = []

    def flush_into_last() -> bool:
        if out and out[-1].role in ("user", "tool"):
            out[-1] = replace(out[-1], content=_join(out[-1].content, *pending))
            pending.clear()
            return True
        return False

    for message in messages[lead:]:
        if message.role == "system":
            if message.content.strip():
                pending.append(as_reminder(message.content))
            continue
        if pending and message.role == "user":
            message = replace(message, content=_join(*pending, message.content))
            pending.clear()
        elif pending and message.role == "assistant" and not flush_into_last():
            out.append(Message("user", _join(*pending)))
            pending.clear()
        out.append(message)  # a tool result keeps the text waiting: it stays with its call
    if pending and not flush_into_last():
        out.append(Message("user", _join(*pending)))
    return tuple(out)
