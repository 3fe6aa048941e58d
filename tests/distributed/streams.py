"""One streamed, greedy reply in each dialect, through its official SDK: the text as the stream
delivered it, and whether the stream ended with an error."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import anthropic
import ollama
import openai

DIALECTS = ("openai", "anthropic", "responses", "ollama")


@dataclass(frozen=True)
class Streamed:
    text: str
    error: str | None = None


class _Parts(list):
    """The text so far; `started` is set with the first piece."""

    def __init__(self, started: threading.Event | None) -> None:
        super().__init__()
        self.started = started

    def append(self, text: str) -> None:
        super().append(text)
        if text and self.started is not None:
            self.started.set()

    def extend(self, texts) -> None:
        for text in texts:
            self.append(text)


def stream(
    dialect: str, url: str, model: str, prompt: str, max_tokens: int, started: threading.Event | None = None
) -> Streamed:
    """`started`: set once the first text arrives."""
    parts = _Parts(started)
    try:
        if dialect == "openai":
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            for chunk in client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": prompt}],
                max_tokens=max_tokens,
                temperature=0,
                stream=True,
            ):
                if chunk.choices and chunk.choices[0].delta.content:
                    parts.append(chunk.choices[0].delta.content)
        elif dialect == "responses":
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            for event in client.responses.create(
                model=model, input=prompt, max_output_tokens=max_tokens, temperature=0, stream=True
            ):
                if event.type == "response.output_text.delta":
                    parts.append(event.delta)
                elif event.type in ("error", "response.failed"):
                    return Streamed("".join(parts), str(event))
        elif dialect == "anthropic":
            claude = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
            with claude.messages.stream(
                model=model,
                max_tokens=max_tokens,
                messages=[{"role": "user", "content": prompt}],
                extra_body={"temperature": 0},
            ) as events:
                parts.extend(events.text_stream)
        else:
            for chunk in ollama.Client(host=url).chat(
                model=model,
                messages=[{"role": "user", "content": prompt}],
                options={"temperature": 0, "num_predict": max_tokens},
                stream=True,
            ):
                parts.append(chunk.message.content or "")
    except Exception as exc:  # each SDK raises its own error type for an in-stream error event
        return Streamed("".join(parts), f"{type(exc).__name__}: {exc}")
    return Streamed("".join(parts))
