"""Clients that hang up while the engine thread works for them, through the real server.

Token counters hanging up while their prompt renders, and a client hanging up while its model loads:
the engine thread lives on, the replies in flight finish, no second engine is loaded and the metrics
drain to zero. The engine is the scripted one, slowed where a client must hang up mid-way.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.hardening.probes import metric, metrics, wait_until
from tests.live_server import running_server, server_settings
from tests.scripted_engine import ScriptedEngine

SLOW = "SLOW"  # a prompt holding this takes a second to tokenize, like a long prompt's render


class Engines:
    """Counts the engines the server loads; each tokenizes SLOW prompts slowly."""

    def __init__(self, load_s: float = 0.0) -> None:
        self.made: list[ScriptedEngine] = []
        self.load_s = load_s

    def factory(self, model, settings, ctx) -> ScriptedEngine:
        time.sleep(self.load_s)
        engine = SlowTokenizing(lambda prompt: "z" * 200, step_delay=0.01)
        self.made.append(engine)
        return engine


class SlowTokenizing(ScriptedEngine):
    def tokenize(self, text: str) -> list[int]:
        if SLOW in text:
            time.sleep(1.0)
        return super().tokenize(text)


def hang_up(url: str, path: str, body: dict, after_s: float) -> None:
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url + path, json=body, timeout=httpx.Timeout(30, read=after_s))


def chat(text: str, **extra) -> dict:
    return {"model": "smollm2", "messages": [{"role": "user", "content": text}], "max_tokens": 500, **extra}


def test_token_counters_hanging_up_mid_render_leave_the_replies_and_the_engine_running(kinfer_home: Path):
    engines = Engines()
    with running_server(server_settings(kinfer_home), engine_factory=engines.factory) as server:
        replies: list[httpx.Response] = []
        running = [
            threading.Thread(
                target=lambda: replies.append(
                    httpx.post(server.url + "/v1/chat/completions", json=chat("go"), timeout=120)
                )
            )
            for _ in range(2)
        ]
        for thread in running:
            thread.start()
        wait_until(lambda: metric(metrics(server.url), "kinfer_rows_busy") == 2, "two replies running")
        for _ in range(3):
            hang_up(server.url, "/v1/messages/count_tokens", chat(SLOW + " count me"), after_s=0.3)
        for thread in running:
            thread.join(60)

        assert [r.status_code for r in replies] == [200, 200]
        assert all(r.json()["choices"][0]["message"]["content"] == "z" * 200 for r in replies)
        again = httpx.post(server.url + "/v1/messages/count_tokens", json=chat("count me"), timeout=60)
        assert again.status_code == 200 and again.json()["input_tokens"] > 0
        wait_until(lambda: metric(metrics(server.url), "kinfer_requests_active") == 0, "no request active")
        assert len(engines.made) == 1  # the engine thread survived: nothing was loaded twice


def test_a_client_hanging_up_while_its_model_loads_leaves_the_model_loaded_once(kinfer_home: Path):
    engines = Engines(load_s=1.0)
    with running_server(server_settings(kinfer_home), engine_factory=engines.factory) as server:
        hang_up(server.url, "/v1/chat/completions", chat("hello", max_tokens=4), after_s=0.3)
        wait_until(lambda: httpx.get(server.url + "/api/ps").json()["models"] != [], "the load to finish")

        reply = httpx.post(server.url + "/v1/chat/completions", json=chat("hello", max_tokens=4), timeout=60)
        assert reply.status_code == 200
        assert len(engines.made) == 1 and not engines.made[0].closed  # kept, and used by the next request


def test_clients_hanging_up_before_their_prompt_is_ready_count_as_cancelled(kinfer_home: Path):
    engines = Engines()
    with running_server(server_settings(kinfer_home), engine_factory=engines.factory) as server:
        httpx.post(server.url + "/v1/messages/count_tokens", json=chat("load"), timeout=60)
        for _ in range(3):
            hang_up(server.url, "/v1/chat/completions", chat(SLOW + " never mind", stream=True), after_s=0.3)
        wait_until(lambda: metric(metrics(server.url), "kinfer_requests_active") == 0, "no request active")
        page = metrics(server.url)
        assert metric(page, "kinfer_requests_total", outcome="cancelled") == 3
        assert metric(page, "kinfer_requests_total", outcome="error") == 0
