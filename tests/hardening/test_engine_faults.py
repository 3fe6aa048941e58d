"""An engine that fails in `step()`, through the real server: running replies get a proper error in
their dialect (a 500 JSON before streaming, an in-stream error event once streaming), requests still
waiting for a row are served by the reloaded model, and the server keeps serving.

The engine is the real llama.cpp engine on SmolLM2; `WatchedEngines` throws the fault into its next
step once, the way a CUDA error or an allocation failure would surface.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.hardening.probes import live_streams, metric, metrics, rows_busy, wait_until
from tests.hardening.watched_engine import WatchedEngines
from tests.live_server import running_server, server_settings

pytestmark = pytest.mark.asyncio(loop_scope="function")

PROMPT = "Write a long story about a lighthouse keeper and a storm."
LONG = 400  # running replies are long, so the fault surely finds them mid-reply


def openai_body(stream: bool, max_tokens: int) -> dict:
    return {
        "model": "smollm2",
        "messages": [{"role": "user", "content": PROMPT}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": stream,
    }


def ollama_body(stream: bool, max_tokens: int) -> dict:
    return {
        "model": "smollm2",
        "messages": [{"role": "user", "content": PROMPT}],
        "stream": stream,
        "options": {"temperature": 0, "num_predict": max_tokens},
    }


async def read_openai_stream(client: httpx.AsyncClient, started: asyncio.Event) -> list[dict | str]:
    events: list[dict | str] = []
    async with client.stream("POST", "/v1/chat/completions", json=openai_body(True, LONG)) as reply:
        assert reply.status_code == 200
        async for line in reply.aiter_lines():
            if line.startswith("data: "):
                events.append("[DONE]" if line == "data: [DONE]" else json.loads(line[6:]))
                if len(events) >= 3:
                    started.set()
    return events


async def read_ollama_stream(client: httpx.AsyncClient, started: asyncio.Event) -> list[dict]:
    lines: list[dict] = []
    async with client.stream("POST", "/api/chat", json=ollama_body(True, LONG)) as reply:
        assert reply.status_code == 200
        async for line in reply.aiter_lines():
            if line.strip():
                lines.append(json.loads(line))
                if len(lines) >= 2:
                    started.set()
    return lines


@pytest.mark.parametrize(
    "fault",
    [RuntimeError("simulated kernel failure"), MemoryError("simulated out of memory")],
    ids=["runtime-error", "out-of-memory"],
)
async def test_a_fault_fails_the_running_replies_in_their_dialect_and_the_queue_survives(tmp_path, fault):
    engines = WatchedEngines()
    settings = server_settings(tmp_path, parallel=3, ctx=1024)
    with running_server(settings, engine_factory=engines.factory) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=300) as client:
            # three replies take the three rows: two streaming (one per dialect) and one not
            openai_started, ollama_started = asyncio.Event(), asyncio.Event()
            openai_stream = asyncio.create_task(read_openai_stream(client, openai_started))
            ollama_stream = asyncio.create_task(read_ollama_stream(client, ollama_started))
            blocking = asyncio.create_task(client.post("/v1/chat/completions", json=openai_body(False, LONG)))
            await asyncio.wait_for(asyncio.gather(openai_started.wait(), ollama_started.wait()), 120)
            await asyncio.to_thread(wait_until, lambda: rows_busy(server.url) == 3, "three busy rows")
            # two more wait for a row
            queued_openai = asyncio.create_task(
                client.post("/v1/chat/completions", json=openai_body(False, 8))
            )
            queued_ollama = asyncio.create_task(client.post("/api/chat", json=ollama_body(False, 8)))
            await asyncio.to_thread(
                wait_until, lambda: metric(metrics(server.url), "kinfer_queue_depth") == 2, "two queued"
            )

            engines.fault.arm(fault)
            openai_events, ollama_lines = await openai_stream, await ollama_stream
            blocked, served_openai, served_ollama = await blocking, await queued_openai, await queued_ollama

        # streaming OpenAI: an error event, then [DONE]; no finish_reason was ever sent
        errors = [e for e in openai_events if isinstance(e, dict) and "error" in e]
        assert len(errors) == 1 and openai_events[-1] == "[DONE]"
        assert errors[0]["error"]["type"] == "server_error"
        assert type(fault).__name__ in errors[0]["error"]["message"]
        # streaming Ollama: an {"error": ...} line ends the stream, no done line
        assert "error" in ollama_lines[-1] and not any(line.get("done") for line in ollama_lines)
        # not streaming yet: a real 500 in OpenAI's envelope
        assert blocked.status_code == 500
        assert blocked.json()["error"]["type"] == "server_error"
        # the queued requests were kept and answered by the reloaded engine
        assert served_openai.status_code == 200, served_openai.text
        assert served_openai.json()["choices"][0]["message"]["content"]
        assert served_ollama.status_code == 200, served_ollama.text
        assert served_ollama.json()["done"] is True
        assert len(engines.loaded) == 2 and engines.fault.fired.is_set()

        wait_until(lambda: rows_busy(server.url) == 0, "every row to be free")
        assert live_streams(server) == 0
        assert metric(metrics(server.url), "kinfer_requests_total", outcome="error") == 3
        again = httpx.post(server.url + "/v1/chat/completions", json=openai_body(False, 4), timeout=120)
        assert again.status_code == 200
