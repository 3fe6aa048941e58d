"""Overload through the real server: a full queue and a queue deadline are real 503s with Retry-After,
in each dialect's envelope, for streaming requests too (headers wait until the request has a row).

The engine is the scripted one (one row, a slow reply) so the row stays taken as long as the test
needs; everything else (HTTP, dialects, scheduler, engine thread) is the real server.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from tests.hardening.probes import metric, metrics, wait_until
from tests.hardening.routes import ROUTES, Route, assert_refused
from tests.live_server import LiveServer, running_server, server_settings
from tests.scripted_engine import ScriptedEngine

GENERATING = [r for r in ROUTES if r.name != "anthropic-count"]
BUSY = {"/v1/messages": 529}  # Anthropic's "overloaded" status; the others use 503


def one_slow_row(model, settings, ctx) -> ScriptedEngine:
    return ScriptedEngine(lambda prompt: "slow " * 2000, rows=1, step_delay=0.01)


@contextmanager
def row_taken(server: LiveServer) -> Iterator[None]:
    """A streaming request holds the only row until the block ends (then its client leaves)."""
    body = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": "hold"}],
        "stream": True,
        "max_tokens": 10_000,
    }
    started, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=120) as reply:
            for _ in reply.iter_lines():
                started.set()
                if leave.is_set():
                    return

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert started.wait(60), "the holding request never started"
        yield
    finally:
        leave.set()
        holder.join(60)


def streaming(route: Route) -> dict:
    body = route.body()
    body["stream"] = True
    return body


DEADLINE_ROUTES = [pytest.param(r, id=r.name) for r in GENERATING]


@pytest.mark.parametrize("route", DEADLINE_ROUTES)
def test_a_request_past_the_queue_deadline_is_a_503_even_when_streaming(tmp_path, route: Route):
    settings = server_settings(tmp_path, queue_timeout=0.5)
    with running_server(settings, engine_factory=one_slow_row) as server, row_taken(server):
        reply = httpx.post(server.url + route.path, json=streaming(route), timeout=60)
        assert_refused(route.path, reply, BUSY.get(route.path, 503))
        assert int(reply.headers["retry-after"]) >= 1


@pytest.mark.parametrize("route", GENERATING, ids=lambda r: r.name)
def test_a_full_queue_is_a_503_with_retry_after(tmp_path, route: Route):
    settings = server_settings(tmp_path, max_queue=1)
    with running_server(settings, engine_factory=one_slow_row) as server, row_taken(server):
        waiting = threading.Thread(
            target=lambda: httpx.post(server.url + "/v1/chat/completions", json=ROUTES[0].body(), timeout=120)
        )
        waiting.start()
        wait_until(lambda: metric(metrics(server.url), "kinfer_queue_depth") == 1, "one queued request")
        for body in (route.body(), streaming(route)):
            reply = httpx.post(server.url + route.path, json=body, timeout=60)
            assert_refused(route.path, reply, BUSY.get(route.path, 503))
            assert int(reply.headers["retry-after"]) >= 1
    waiting.join(60)


def test_a_streaming_client_that_leaves_while_queued_is_dropped_from_the_queue(tmp_path):
    with running_server(server_settings(tmp_path), engine_factory=one_slow_row) as server, row_taken(server):
        body = streaming(ROUTES[0])
        with pytest.raises(httpx.ReadTimeout):
            # no headers come while the request waits for the row; the client gives up
            httpx.post(server.url + "/v1/chat/completions", json=body, timeout=httpx.Timeout(5, read=1))
        wait_until(lambda: metric(metrics(server.url), "kinfer_queue_depth") == 0, "the queue to empty")
        outcome = metric(metrics(server.url), "kinfer_requests_total", outcome="cancelled")
        assert outcome >= 1
