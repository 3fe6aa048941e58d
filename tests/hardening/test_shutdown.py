"""Shutting down never cuts a reply mid-body: the server drains.

On SIGTERM (or Ctrl-C) new requests get 503 and /health says so, replies in flight have
--shutdown-grace seconds to finish, and those still running then end with their dialect's error event:
OpenAI `data: {"error": ...}` then `data: [DONE]`, Anthropic `event: error`, Ollama an `{"error": ...}`
line, Responses `response.failed`. A stream never just stops.

The in-process tests run the real server on the scripted engine (a slow reply of known length); the
last one sends a real SIGTERM to `kinfer --headless` on the bundled SmolLM2.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.hardening.probes import wait_until
from tests.hardening.routes import assert_refused
from tests.live_server import LiveServer, running_server, server_settings
from tests.scripted_engine import ScriptedEngine


@dataclass(frozen=True)
class Dialect:
    name: str
    path: str
    body: dict
    finished: str  # a line only a properly finished stream carries
    failed: str  # a line only the dialect's in-stream error carries

    def ending(self, lines: list[str]) -> str:
        """How the stream ended: "finished", "error" (the dialect's error event) or "cut"."""
        text = "\n".join(lines)
        if self.name == "openai":
            if lines and lines[-1] == "data: [DONE]":
                return "error" if '"error"' in text else "finished"
            return "cut"
        if self.name == "ollama":
            last = json.loads(lines[-1]) if lines else {}
            return "finished" if last.get("done") else "error" if "error" in last else "cut"
        if self.failed in lines[-2:]:
            return "error"
        return "finished" if self.finished in lines[-2:] else "cut"


def dialects(max_tokens: int) -> list[Dialect]:
    messages = [{"role": "user", "content": "Tell me a long story."}]
    return [
        Dialect(
            "openai",
            "/v1/chat/completions",
            {"model": "smollm2", "messages": messages, "max_tokens": max_tokens, "stream": True},
            "data: [DONE]",
            '"error"',
        ),
        Dialect(
            "anthropic",
            "/v1/messages",
            {"model": "smollm2", "messages": messages, "max_tokens": max_tokens, "stream": True},
            "event: message_stop",
            "event: error",
        ),
        Dialect(
            "ollama",
            "/api/chat",
            {
                "model": "smollm2",
                "messages": messages,
                "stream": True,
                "options": {"num_predict": max_tokens},
            },
            '"done": true',
            '"error"',
        ),
        Dialect(
            "responses",
            "/v1/responses",
            {
                "model": "smollm2",
                "input": "Tell me a long story.",
                "max_output_tokens": max_tokens,
                "stream": True,
            },
            "event: response.completed",
            "event: response.failed",
        ),
    ]


@dataclass
class Reader:
    """One streaming client, reading on its own thread until the server ends the body."""

    url: str
    dialect: Dialect
    lines: list[str] = field(default_factory=list)
    status: int = 0
    error: str | None = None
    started: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> Reader:
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        return self

    def _read(self) -> None:
        try:
            with httpx.stream("POST", self.url + self.dialect.path, json=self.dialect.body, timeout=120) as r:
                self.status = r.status_code
                for line in r.iter_lines():
                    if line.strip():
                        self.lines.append(line)
                    if len(self.lines) >= 4:
                        self.started.set()
        except httpx.HTTPError as exc:  # a body cut short (RemoteProtocolError) lands here
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.started.set()

    def ending(self) -> str:
        assert self.thread is not None
        self.thread.join(60)
        assert not self.thread.is_alive(), f"{self.dialect.name}: the stream never ended"
        return "cut" if self.error else self.dialect.ending(self.lines)


def scripted(reply_chars: int):
    def factory(model, settings, ctx) -> ScriptedEngine:
        return ScriptedEngine(lambda prompt: "word " * (reply_chars // 5), rows=4, step_delay=0.01)

    return factory


def start_streams(server: LiveServer, max_tokens: int) -> list[Reader]:
    readers = [Reader(server.url, d).start() for d in dialects(max_tokens)]
    for reader in readers:
        assert reader.started.wait(60) and reader.status == 200, (reader.dialect.name, reader.error)
    return readers


def test_replies_still_running_after_the_grace_period_end_with_each_dialects_error_event(tmp_path: Path):
    settings = server_settings(tmp_path, shutdown_grace=1.0)
    with running_server(settings, engine_factory=scripted(10_000)) as server:  # ~100 s per reply
        readers = start_streams(server, max_tokens=10_000)
        server.begin_shutdown()
        wait_until(lambda: httpx.get(server.url + "/health", timeout=5).status_code == 503, "/health 503")
        late = httpx.post(
            server.url + "/v1/messages", json=dialects(4)[1].body | {"stream": False}, timeout=30
        )
        assert "shutting down" in assert_refused("/v1/messages", late, 503, 529)

        endings = {r.dialect.name: r.ending() for r in readers}
        assert server.stopped(30)
    assert endings == {name: "error" for name in endings}, {r.dialect.name: r.lines[-2:] for r in readers}
    for reader in readers:
        assert "shutting down" in "\n".join(reader.lines[-3:]), reader.dialect.name


def test_replies_that_finish_within_the_grace_period_finish_whole(tmp_path: Path):
    settings = server_settings(tmp_path, shutdown_grace=60.0)
    with running_server(settings, engine_factory=scripted(300)) as server:  # ~3 s per reply
        readers = start_streams(server, max_tokens=1000)
        started = time.monotonic()
        server.begin_shutdown()
        refused = httpx.post(server.url + "/api/chat", json=dialects(4)[2].body, timeout=30)
        assert "shutting down" in assert_refused("/api/chat", refused, 503)

        endings = {r.dialect.name: r.ending() for r in readers}
        assert server.stopped(30)
        assert time.monotonic() - started < 30  # it stopped once the replies were done, not at the grace
    assert endings == {name: "finished" for name in endings}


# ---- a real SIGTERM to `kinfer --headless` -----------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigterm_drains_kinfer_headless_and_every_stream_ends_honestly(tmp_path: Path):
    port = free_port()
    env = {
        **os.environ,
        "KINFER_HOME": str(tmp_path),
        "OLLAMA_MODELS": str(tmp_path / "no-ollama"),
        "KINFER_THREADS": "1",
        "KINFER_SHUTDOWN_GRACE": "2",
    }
    command = [sys.executable, "-m", "kinfer", "--headless", "--port", str(port), "--parallel", "4"]
    command += ["--ctx", "2048"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _health(url) == 200, "the server to start", timeout=120)
        readers = [Reader(url, d).start() for d in dialects(1500)]
        for reader in readers:
            assert reader.started.wait(120) and reader.status == 200, (reader.dialect.name, reader.error)
        process.send_signal(signal.SIGTERM)
        wait_until(lambda: _health(url) in (503, None), "/health to say the server is shutting down")
        endings = {r.dialect.name: r.ending() for r in readers}
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    output = process.stdout.read() if process.stdout else ""
    assert "Traceback" not in output, output[-2000:]
    assert "shutting down" in output
    # each reply either finished within the 2 s grace or ended with its dialect's error event
    assert set(endings.values()) <= {"finished", "error"}, endings
    assert "error" in endings.values()  # 1,500 tokens on one CPU thread outlast the grace


def _health(url: str) -> int | None:
    try:
        return httpx.get(url + "/health", timeout=2).status_code
    except httpx.HTTPError:
        return None
