"""The load test's clients: one streaming chat each, in the OpenAI (SSE) or Ollama (NDJSON) dialect, that
may leave after some chunks or hang up at a moment (scripts/load_test.py)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import httpx

PROMPTS = (
    "Name three fruits.",
    "What is 2 + 2?",
    "Say hello in French.",
    "What colour is the sky?",
    "Write one sentence about the sea.",
    "What is the capital of Italy?",
    "Name a planet.",
    "Give me a number between 1 and 10.",
    "What do bees make?",
    "Describe a cat in five words.",
    "What is the opposite of hot?",
    "Name a musical instrument.",
    "How many legs does a spider have?",
    "What is water made of?",
    "Suggest a name for a dog.",
    "What season comes after winter?",
)
DIALECTS = ("openai", "ollama")


@dataclass
class ClientResult:
    index: int
    dialect: str
    prompt: int
    leave_after: int | None  # content chunks to read before closing; None = stay to the end
    leave_at_s: float | None = None  # hang up this long after sending, wherever the request is by then
    status: int = 0
    text: str = ""
    finish: str | None = None
    left: bool = False
    error: str | None = None
    first_token_s: float | None = None
    total_s: float = 0.0
    chunks: int = 0


def request_for(dialect: str, prompt: str, max_tokens: int, stream: bool) -> tuple[str, dict]:
    messages = [{"role": "user", "content": prompt}]
    if dialect == "openai":
        return "/v1/chat/completions", {
            "model": "smollm2",
            "messages": messages,
            "temperature": 0,
            "max_tokens": max_tokens,
            "stream": stream,
        }
    # the same sampling as the OpenAI request (Ollama's default repeat penalty is 1.1)
    options = {"temperature": 0, "num_predict": max_tokens, "repeat_penalty": 1.0}
    return "/api/chat", {"model": "smollm2", "messages": messages, "stream": stream, "options": options}


async def reference(client: httpx.AsyncClient, dialect: str, prompt: int, max_tokens: int) -> tuple[str, int]:
    """The prompt's greedy reply alone, streamed the same way: (text, content chunks)."""
    solo = ClientResult(index=-1, dialect=dialect, prompt=prompt, leave_after=None)
    await run_client(client, solo, max_tokens)
    if solo.status != 200 or solo.error or not solo.finish:
        raise RuntimeError(f"the reference reply for prompt {prompt} failed: {solo.status} {solo.error}")
    return solo.text, solo.chunks


def parse_chunk(dialect: str, line: str) -> tuple[str, str | None, str | None] | None:
    """(text, finish, error) from one line of the stream, or None for a line that carries nothing."""
    if dialect == "openai":
        if not line.startswith("data: ") or line == "data: [DONE]":
            return None
        chunk = json.loads(line[6:])
        if "error" in chunk:
            return "", None, json.dumps(chunk["error"])
        text, finish = "", None
        for choice in chunk["choices"]:
            text += choice["delta"].get("content") or ""
            finish = choice.get("finish_reason") or finish
        return text, finish, None
    if not line.strip():
        return None
    chunk = json.loads(line)
    if "error" in chunk:
        return "", None, chunk["error"]
    return (
        chunk.get("message", {}).get("content", ""),
        chunk.get("done_reason") if chunk.get("done") else None,
        None,
    )


async def run_client(client: httpx.AsyncClient, result: ClientResult, max_tokens: int) -> None:
    started = time.monotonic()
    chunks: list[str] = []
    try:
        async with asyncio.timeout(result.leave_at_s):  # None: no hang-up
            await _read_reply(client, result, max_tokens, started, chunks)
    except TimeoutError:
        result.left = True  # the client hung up, wherever its request was
    finally:
        result.text = "".join(chunks)
        result.chunks = len(chunks)
        result.total_s = time.monotonic() - started


async def _read_reply(
    client: httpx.AsyncClient, result: ClientResult, max_tokens: int, started: float, chunks: list[str]
) -> None:
    path, body = request_for(result.dialect, PROMPTS[result.prompt], max_tokens, stream=True)
    try:
        async with client.stream("POST", path, json=body) as reply:
            result.status = reply.status_code
            if reply.status_code != 200:
                await reply.aread()
                result.error = reply.text[:200]
                return
            if result.leave_after == 0:
                result.left = True
                return
            async for line in reply.aiter_lines():
                parsed = parse_chunk(result.dialect, line)
                if parsed is None:
                    continue
                text, finish, error = parsed
                if error:
                    result.error = error
                if text:
                    if result.first_token_s is None:
                        result.first_token_s = time.monotonic() - started
                    chunks.append(text)
                result.finish = finish or result.finish
                if result.leave_after is not None and len(chunks) >= result.leave_after:
                    result.left = True  # leaving the `async with` closes the connection mid-stream
                    return
    except httpx.HTTPError as exc:
        result.error = f"{type(exc).__name__}: {exc}"
