"""A Claude-Code-shaped session on the real bundled SmolLM2: the prefix cache hits from turn 2 on.

Claude Code streams every turn with the same large system prompt (in blocks with `cache_control`),
the same tools, and a first system block whose `cch=` value changes on every request. kinfer strips
that value, so each turn's prompt starts exactly like the last one and the prefix pool adopts it.
"""

from __future__ import annotations

import anthropic
import pytest

from tests.live_server import LiveServer

pytestmark = pytest.mark.slow

# large enough to matter (hundreds of tokens), small enough for a 2-core CI machine
RULES = "\n".join(f"Rule {i}: read module {i} and run its tests before changing it." for i in range(16))
TOOLS = [
    {
        "name": "Bash",
        "description": "Run a shell command.",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
    {
        "name": "Read",
        "description": "Read a file.",
        "input_schema": {
            "type": "object",
            "properties": {"file_path": {"type": "string"}},
            "required": ["file_path"],
        },
    },
]
BILLING_HEADER = "x-anthropic-billing-header: cc_version=2.1.177.01c; cc_entrypoint=cli;"
QUESTIONS = ["List the files here.", "Which one is the largest?", "Thanks. Anything else?"]


def system(cch: str) -> list[dict]:
    ephemeral = {"type": "ephemeral"}
    return [
        {"type": "text", "text": f"{BILLING_HEADER} cch={cch};"},
        {"type": "text", "text": "You are Claude Code, a CLI for coding.", "cache_control": ephemeral},
        {"type": "text", "text": f"# Rules\n{RULES}", "cache_control": ephemeral},
    ]


def user_turn(question: str) -> dict:
    reminder = "<system-reminder>The working directory is /work.</system-reminder>"
    return {
        "role": "user",
        "content": [
            {"type": "text", "text": reminder},
            {"type": "text", "text": question, "cache_control": {"type": "ephemeral"}},
        ],
    }


def test_the_prefix_cache_hits_from_the_second_turn_on(smol_server: LiveServer):
    client = anthropic.Anthropic(base_url=smol_server.url, api_key="sk-ant-unused", max_retries=0)
    system_tokens = client.messages.count_tokens(
        model="smollm2", system=system("00000"), messages=[]
    ).input_tokens
    messages: list[dict] = []
    usages = []
    for turn, (question, cch) in enumerate(zip(QUESTIONS, ("36ee5", "0aaa9", "7b4c1"), strict=True)):
        messages.append(user_turn(question))
        with client.messages.stream(
            model="smollm2",
            max_tokens=12,
            system=system(cch),
            tools=TOOLS,
            messages=messages,
            metadata={"user_id": "session-1"},
            extra_headers={"anthropic-beta": "claude-code-20250219", "anthropic-version": "2023-06-01"},
            extra_query={"beta": "true"},
        ) as stream:
            final = stream.get_final_message()
        usages.append(final.usage)
        text = "".join(b.text for b in final.content if b.type == "text") or "(no answer)"
        messages.append({"role": "assistant", "content": [{"type": "text", "text": text}]})
        assert final.stop_reason in ("end_turn", "max_tokens"), turn

    first, *later = usages
    assert first.cache_read_input_tokens == 0  # a fresh server has nothing to reuse
    for usage in later:
        # at least the whole system prompt, which starts with the header whose cch= changed
        assert usage.cache_read_input_tokens >= system_tokens
        assert usage.input_tokens < usage.cache_read_input_tokens  # most of the prompt was reused
