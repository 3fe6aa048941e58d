"""Clients that go away mid-stream: the row is freed on the engine's next step, and nothing leaks.

The server runs the real llama.cpp engine on the bundled SmolLM2, wrapped (`WatchedEngine`) only to
count steps: for every cancelled job, the step that reports its row free must be the one right after
the step during which the cancel arrived.
"""

from __future__ import annotations

import asyncio
import json
import random

import httpx
import pytest

from tests.hardening.probes import live_streams, metric, metrics, rows_busy, wait_until
from tests.hardening.watched_engine import WatchedEngines
from tests.live_server import LiveServer, running_server, server_settings

pytestmark = pytest.mark.asyncio(loop_scope="function")

PROMPT = "Write a long story about a dragon who learns to bake bread in Lyon."
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("kinfer-home")
    engines = WatchedEngines()
    mp = pytest.MonkeyPatch()
    mp.setenv("OLLAMA_MODELS", str(home / "no-ollama"))
    with running_server(server_settings(home, parallel=8, ctx=512), engine_factory=engines.factory) as server:
        yield server, engines
    mp.undo()


def openai_body(stream: bool) -> dict:
    return {
        "model": "smollm2",
        "messages": [{"role": "user", "content": PROMPT}],
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "stream": stream,
    }


def ollama_body(stream: bool) -> dict:
    return {
        "model": "smollm2",
        "messages": [{"role": "user", "content": PROMPT}],
        "stream": stream,
        "options": {"temperature": 0, "num_predict": MAX_TOKENS},
    }


async def openai_stream(client: httpx.AsyncClient, leave_after: int | None) -> tuple[str, bool]:
    """(text, left early). Leaving = closing the connection after `leave_after` content chunks."""
    text: list[str] = []
    async with client.stream("POST", "/v1/chat/completions", json=openai_body(True)) as reply:
        assert reply.status_code == 200
        async for line in reply.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            for choice in chunk["choices"]:
                if choice["delta"].get("content"):
                    text.append(choice["delta"]["content"])
            if leave_after is not None and len(text) >= leave_after:
                return "".join(text), True
    return "".join(text), False


async def ollama_stream(client: httpx.AsyncClient, leave_after: int | None) -> tuple[str, bool]:
    text: list[str] = []
    async with client.stream("POST", "/api/chat", json=ollama_body(True)) as reply:
        assert reply.status_code == 200
        async for line in reply.aiter_lines():
            if not line.strip():
                continue
            chunk = json.loads(line)
            assert "error" not in chunk, chunk
            if chunk["message"].get("content"):
                text.append(chunk["message"]["content"])
            if leave_after is not None and len(text) >= leave_after:
                return "".join(text), True
    return "".join(text), False


def assert_freed_on_the_next_step(engines: WatchedEngines, job_ids: set[str]) -> None:
    engine = engines.latest
    for job_id in job_ids:
        step, reason = engine.finish_steps[job_id]
        assert reason == "cancelled", (job_id, reason)
        assert step == engine.cancel_steps[job_id] + 1, (job_id, engine.cancel_steps[job_id], step)


def settle(server: LiveServer) -> None:
    wait_until(lambda: rows_busy(server.url) == 0, "every row to be free")
    wait_until(lambda: live_streams(server) == 0, "the scheduler to drop every stream")


async def test_a_client_that_leaves_mid_stream_frees_its_row_on_the_next_step(watched):
    server, engines = watched
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
        text, left = await openai_stream(client, leave_after=3)
    assert left and text
    settle(server)
    engine = engines.latest
    cancelled = {job for job, (_, why) in engine.finish_steps.items() if why == "cancelled"}
    assert len(cancelled) == 1
    assert_freed_on_the_next_step(engines, cancelled)


async def test_a_burst_where_half_the_clients_leave_frees_every_row_and_leaks_nothing(watched):
    server, engines = watched
    before = metrics(server.url)
    engine = engines.latest
    already = set(engine.finish_steps)
    async with httpx.AsyncClient(base_url=server.url, timeout=300) as client:
        # each dialect's greedy reply, alone: the reference every client that stays must receive
        solo_openai = (await client.post("/v1/chat/completions", json=openai_body(False))).json()
        solo_ollama = (await client.post("/api/chat", json=ollama_body(False))).json()
        rng = random.Random(10)
        plan = [
            (kind, rng.randint(1, 6) if i % 2 else None) for i in range(16) for kind in ("openai", "ollama")
        ]
        results = await asyncio.gather(
            *(
                openai_stream(client, leave) if kind == "openai" else ollama_stream(client, leave)
                for kind, leave in plan
            )
        )
    settle(server)
    after = metrics(server.url)

    leavers = sum(1 for _, leave in plan if leave is not None)
    assert leavers == 16 and all(left for (_, left), (_, leave) in zip(results, plan, strict=True) if leave)
    for (kind, leave), (text, _) in zip(plan, results, strict=True):
        if leave is None:
            expected = (
                solo_openai["choices"][0]["message"]["content"]
                if kind == "openai"
                else solo_ollama["message"]["content"]
            )
            assert text == expected, kind
    cancelled_now = metric(after, "kinfer_requests_total", outcome="cancelled") - metric(
        before, "kinfer_requests_total", outcome="cancelled"
    )
    assert cancelled_now == leavers
    burst = set(engine.finish_steps) - already
    assert len(burst) == 2 + len(plan)  # the two references, then every client's row: all freed
    cancelled = {job for job in burst if engine.finish_steps[job][1] == "cancelled"}
    assert len(cancelled) == leavers
    assert_freed_on_the_next_step(engines, cancelled)
    assert metric(after, "kinfer_requests_active") == 0
    assert metric(after, "kinfer_queue_depth") == 0
