"""A memory budget smaller than the automatic plan, through the real server on the bundled SmolLM2:
the model loads with fewer rows and a shorter context, every request is still answered, the account
stays inside the budget, and a context that cannot fit is a 400 in the caller's dialect."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from kinfer.engines.llama.sizing import ROWS_CPU
from kinfer.engines.memory_account import PARTS
from tests.live_server import running_server, server_settings

MIB = 1 << 20
# SmolLM2's weights (~92 MiB), its compute buffers (~100 MiB, ~120 MiB as sizing reckons them) and
# 100 MiB of room: the KV of 1 row + 1 pool slot x 2048 tokens (22.5 KiB per token), not 4 + 4 x 4096;
# six requests at once then share the one row, waiting their turn
BUDGET = (92 + 120 + 100) * MIB


@pytest.fixture
def small_server(kinfer_home: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OLLAMA_MODELS", str(kinfer_home / "no-ollama"))
    settings = server_settings(kinfer_home, parallel=0, ctx=0, memory_budget_gb=BUDGET / (1 << 30))
    with running_server(settings) as server:
        yield server


async def _ask(client: httpx.AsyncClient, i: int) -> dict:
    reply = await client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": f"Name a colour ({i})."}], "max_tokens": 8},
    )
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_a_small_budget_shrinks_the_plan_and_the_server_keeps_serving(small_server):
    async def burst() -> list[dict]:
        async with httpx.AsyncClient(base_url=small_server.url, timeout=120) as client:
            return await asyncio.gather(*(_ask(client, i) for i in range(6)))

    replies = asyncio.run(burst())
    assert all(r["usage"]["completion_tokens"] > 0 for r in replies)

    (model,) = httpx.get(small_server.url + "/api/ps", timeout=10).json()["models"]
    memory = model["memory"]
    assert memory["budget"] == BUDGET
    assert sum(memory[part] for part in PARTS) == memory["total"] <= BUDGET
    loaded = small_server.runtime.scheduler.loaded_models()[0].info
    assert loaded.rows * loaded.context_length < ROWS_CPU * 4096


def test_a_context_the_budget_cannot_hold_is_refused_in_the_dialects_shape(small_server):
    reply = httpx.post(
        small_server.url + "/api/chat",
        json={
            "model": "smollm2:135m",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": False,
            "options": {"num_ctx": 8192},
        },
        timeout=120,
    )
    assert reply.status_code == 400
    assert "memory budget" in reply.json()["error"]
