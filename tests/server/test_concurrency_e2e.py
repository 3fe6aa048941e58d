"""64 concurrent streaming requests on the real model: every reply whole, none crossing another."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest

from tests.live_server import LiveServer, running_server, server_settings

pytestmark = pytest.mark.asyncio(loop_scope="function")

PROMPTS = [
    "Name three fruits.",
    "What is 2 + 2?",
    "Say hello in French.",
    "What colour is the sky?",
    "Write one word about the sea.",
    "What is the capital of Italy?",
    "Name a planet.",
    "Give me a number between 1 and 10.",
]


@pytest.fixture(scope="module")
def wide_server(tmp_path_factory: pytest.TempPathFactory) -> LiveServer:
    home = tmp_path_factory.mktemp("kinfer-home")
    with running_server(server_settings(home, parallel=8, ctx=512)) as server:
        yield server


def body(prompt: str, stream: bool) -> dict:
    return {
        "model": "smollm2",
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": 24,
        "stream": stream,
        "stream_options": {"include_usage": True},
    }


async def stream_text(client: httpx.AsyncClient, prompt: str) -> tuple[str, str]:
    text, finish = [], None
    async with client.stream("POST", "/v1/chat/completions", json=body(prompt, True)) as reply:
        assert reply.status_code == 200
        async for line in reply.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk["choices"]:
                text.append(choice["delta"].get("content") or "")
                finish = choice["finish_reason"] or finish
    return "".join(text), finish


async def busy_rows(client: httpx.AsyncClient, seen: list[int], stop: asyncio.Event) -> None:
    while not stop.is_set():
        metrics = (await client.get("/metrics")).text
        match = re.search(r'^kinfer_rows_busy\{model="[^"]+"\} (\d+)', metrics, re.M)
        if match:
            seen.append(int(float(match.group(1))))
        await asyncio.sleep(0.05)


async def test_64_concurrent_streams_complete_whole_and_batched(wide_server: LiveServer):
    async with httpx.AsyncClient(base_url=wide_server.url, timeout=300) as client:
        solo = {}
        for prompt in PROMPTS:  # each prompt alone: the reference text
            reply = await client.post("/v1/chat/completions", json=body(prompt, False))
            solo[prompt] = reply.json()["choices"][0]["message"]["content"]
        stop, seen = asyncio.Event(), []
        watcher = asyncio.create_task(busy_rows(client, seen, stop))
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(64)]
        results = await asyncio.gather(*(stream_text(client, p) for p in prompts))
        stop.set()
        await watcher
    for prompt, (text, finish) in zip(prompts, results, strict=True):
        assert text == solo[prompt], prompt
        assert finish in ("stop", "length")
    assert max(seen) > 1, seen
    metrics = httpx.get(wide_server.url + "/metrics").text
    assert re.search(r'^kinfer_rows_busy\{model="smollm2:135m"\} 0', metrics, re.M)
