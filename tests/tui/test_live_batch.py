"""The dashboard over a real server: the same Quart app and scheduler `--headless` runs, on the
dashboard's own event loop. Requests go over HTTP; the engine is the scripted one (the real engine
protocol, one character per step) slowed down so each reply lasts long enough to watch."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from pathlib import Path

import httpx
import pytest

from kinfer.request_log import LOGGER_NAME as REQUEST_LOGGER
from kinfer.runtime import Runtime
from kinfer.server.http import bind_socket
from kinfer.tui.app import KinferDashboard
from kinfer.tui.live import LiveSource
from kinfer.tui.log_capture import QueueLogHandler
from kinfer.tui.server_task import ServerTask
from kinfer.tui.widgets.batch_table import BatchTable
from kinfer.tui.widgets.model_table import ModelTable
from kinfer.tui.widgets.request_log import RequestLog, entry_line
from tests.live_server import server_settings
from tests.scripted_engine import ScriptedEngine

pytestmark = pytest.mark.asyncio

REPLY = "The quick brown fox jumps over the lazy dog."  # 44 characters = 44 tokens
STEP_S = 0.04  # about 2 s per reply
FADE_S = 1.0
WAIT_S = 60  # an upper bound for a slow machine, not a timing assertion


class PacedEngine(ScriptedEngine):
    """The scripted engine, one step every STEP_S, as a slow real model would be."""

    def step(self):
        time.sleep(STEP_S)
        return super().step()


def make_dashboard(home: Path, rows: int) -> tuple[KinferDashboard, socket.socket]:
    """The dashboard over a real runtime serving on a socket of its own (port 0)."""
    runtime = Runtime.build(
        server_settings(home, parallel=rows),
        engine_factory=lambda model, settings, ctx: PacedEngine(lambda prompt: REPLY, rows=rows),
    )
    sock = bind_socket("127.0.0.1", 0)
    app = KinferDashboard(
        source=LiveSource(runtime.scheduler, runtime.requests),
        store=runtime.store,
        scheduler=runtime.scheduler,
        server=ServerTask(runtime, sock),
        fade_seconds=FADE_S,
    )
    return app, sock


@pytest.fixture
def dashboard(kinfer_home: Path):
    app, sock = make_dashboard(kinfer_home, rows=4)
    yield app
    sock.close()  # a no-op once the server has stopped: it forgets the fd Hypercorn closed


async def until(pilot, condition, what: str):
    for _ in range(WAIT_S * 20):
        value = condition()
        if value:
            return value
        await pilot.pause(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def chat(url: str, text: str) -> list[dict]:
    """One streaming Ollama chat; returns its NDJSON chunks."""
    body = {"model": "smollm2:135m", "messages": [{"role": "user", "content": text}], "stream": True}
    async with (
        httpx.AsyncClient(timeout=WAIT_S) as client,
        client.stream("POST", url + "/api/chat", json=body) as reply,
    ):
        assert reply.status_code == 200
        return [json.loads(line) async for line in reply.aiter_lines() if line]


async def test_rows_appear_with_rising_counts_then_fade_and_go(dashboard: KinferDashboard) -> None:
    async with dashboard.run_test(size=(120, 36)) as pilot:
        batch = pilot.app.query_one(BatchTable)
        clients = [asyncio.create_task(chat(dashboard.url, f"question {i}")) for i in range(3)]

        def decoding():
            rows = {k: r for k, r in batch.shown.items() if r.state == "decoding" and r.generated > 0}
            return rows if len(rows) == 3 else None

        first = await until(pilot, decoding, "three rows decoding")
        later = await until(
            pilot,
            lambda: all(
                k in batch.shown and batch.shown[k].generated > r.generated for k, r in first.items()
            ),
            "the token counts to rise",
        )
        assert later
        assert {r.dialect for r in first.values()} == {"ollama"}
        assert pilot.app.query_one(ModelTable).loaded == {"smollm2:135m"}  # loaded by the first request

        # finished: still there a moment, dimmed, then gone. Watched while the replies end: on a busy
        # machine they can end more than the fade apart, and the first is gone before the last ends.
        finished: set[str] = set()

        def three_seen_finished() -> bool:
            for key, row in batch.shown.items():
                if row.finish is not None:
                    assert key in batch.fading
                    finished.add(key)
            if finished and set(batch.shown) <= finished:  # every row on screen is a finished one
                assert all(row.style == "dim" for row in batch.rows)
            return len(finished) == 3

        await until(pilot, three_seen_finished, "three finished rows, dimmed")
        replies = await asyncio.gather(*clients)
        for chunks in replies:
            assert "".join(c["message"]["content"] for c in chunks) == REPLY
        await until(pilot, lambda: not batch.shown, "the finished rows to go")

        log = pilot.app.query_one(RequestLog)
        await until(pilot, lambda: len(log.entries) == 3, "three lines in the request log")
        assert {(e.dialect, e.model, e.generated, e.finish) for e in log.entries} == {
            ("ollama", "smollm2:135m", len(REPLY), "stop")
        }
        assert pilot.app.rates.decode_history and max(pilot.app.rates.decode_history) > 0
        assert pilot.app.tick_failures == 0


async def test_quitting_stops_the_server_cleanly(dashboard: KinferDashboard) -> None:
    async with dashboard.run_test(size=(120, 36)) as pilot:
        async with httpx.AsyncClient() as client:
            tags = await client.get(dashboard.url + "/api/tags")
        assert tags.status_code == 200
        assert "smollm2:135m" in {m["name"] for m in tags.json()["models"]}
        await chat(dashboard.url, "load the model")
        assert dashboard.scheduler.loaded_models()
        await pilot.press("q")
    assert dashboard.return_code == 0
    assert not dashboard.server.running
    assert dashboard.scheduler.loaded_models() == []  # the engine thread was stopped


async def test_load_and_unload_from_the_store_panel(dashboard: KinferDashboard) -> None:
    async with dashboard.run_test(size=(120, 36)) as pilot:
        table = pilot.app.query_one(ModelTable)
        await until(pilot, lambda: "smollm2:135m" in table.models, "the store listing")
        table.move_cursor(row=table.get_row_index("smollm2:135m"))

        await pilot.press("l")
        await until(pilot, lambda: table.loaded == {"smollm2:135m"}, "the model to show as loaded")
        assert [m.name for m in dashboard.scheduler.loaded_models()] == ["smollm2:135m"]
        assert "●" in str(table.get_row("smollm2:135m")[0])

        await pilot.press("l")
        await until(pilot, lambda: not table.loaded, "the model to show as unloaded")
        assert dashboard.scheduler.loaded_models() == []
        await pilot.press("q")


async def test_a_burst_of_64_streams_is_served_and_shown(kinfer_home: Path) -> None:
    """Every stream gets its whole reply while the dashboard refreshes; each shows up and is logged."""
    app, sock = make_dashboard(kinfer_home, rows=64)
    async with app.run_test(size=(120, 36)) as pilot:
        batch = pilot.app.query_one(BatchTable)
        peak = 0

        async def watch() -> None:
            nonlocal peak
            while True:
                peak = max(peak, sum(1 for r in batch.shown.values() if r.finish is None))
                await asyncio.sleep(0.05)

        watcher = asyncio.create_task(watch())
        replies = await asyncio.gather(*(chat(app.url, f"burst {i}") for i in range(64)))
        watcher.cancel()
        assert all("".join(c["message"]["content"] for c in chunks) == REPLY for chunks in replies)
        log = pilot.app.query_one(RequestLog)
        await until(pilot, lambda: len(log.entries) == 64, "64 lines in the request log")
        assert peak > 32  # most of the burst was on screen at once
        assert pilot.app.tick_failures == 0
        await pilot.press("q")
    sock.close()


async def test_the_request_pane_shows_every_request_not_only_generations(dashboard: KinferDashboard) -> None:
    """A `GET /api/tags` or a refused request is a line of its own, with its status, as in the
    headless log; a generation shows its tokens."""
    async with dashboard.run_test(size=(120, 36)) as pilot:
        async with httpx.AsyncClient(timeout=WAIT_S) as client:
            assert (await client.get(dashboard.url + "/api/tags")).status_code == 200
            assert (await client.post(dashboard.url + "/api/show", json={"model": "nope"})).status_code == 404
        await chat(dashboard.url, "hello")
        log = pilot.app.query_one(RequestLog)
        await until(pilot, lambda: len(log.entries) == 3, "three lines in the request log")

        tags, missing, chatted = log.entries
        assert (tags.method, tags.path, tags.status, tags.dialect, tags.finish) == (
            "GET",
            "/api/tags",
            200,
            "ollama",
            "",
        )
        assert (missing.path, missing.status) == ("/api/show", 404)
        assert (chatted.path, chatted.status, chatted.finish, chatted.generated) == (
            "/api/chat",
            200,
            "stop",
            len(REPLY),
        )
        shown = [entry_line(entry).plain for entry in log.entries]
        assert "200" in shown[0] and shown[0].endswith("GET /api/tags")
        assert "404" in shown[1] and shown[1].endswith("POST /api/show")
        assert shown[2].endswith("smollm2:135m") and "stop" in shown[2]
        await pilot.press("q")


async def test_the_request_log_lines_are_not_shown_twice() -> None:
    """The pane shows requests as entries; the same requests' log lines stay out of its log lines."""
    handler = QueueLogHandler(skip=(REQUEST_LOGGER,))

    def record(name: str, level: int, text: str) -> logging.LogRecord:
        return logging.LogRecord(name, level, __file__, 0, text, None, None)

    handler.handle(record(REQUEST_LOGGER, logging.INFO, '127.0.0.1 "GET /api/tags" 200 ollama 2ms'))
    handler.handle(record("kinfer.scheduler", logging.INFO, "loaded smollm2:135m"))
    handler.handle(record(REQUEST_LOGGER, logging.ERROR, "a request-log listener failed"))
    assert [line.text for line in handler.drain()] == [
        "loaded smollm2:135m",
        "error: kinfer.requests: a request-log listener failed",  # trouble is always shown
    ]
