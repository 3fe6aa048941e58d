"""`kinfer --headless`, `kinfer ps` and `kinfer run` as a user runs them: real processes, real model."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from kinfer.engines.memory_account import PARTS


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env(home: Path) -> dict[str, str]:
    # one llama.cpp thread: ggml's spinning barrier stalls when the test's own processes take a core
    return {
        **os.environ,
        "KINFER_HOME": str(home),
        "OLLAMA_MODELS": str(home / "no-ollama"),
        "KINFER_THREADS": "1",
    }


def kinfer(*args: str, home: Path, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    env = server_env(home)
    return subprocess.run(
        [sys.executable, "-m", "kinfer", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        **kwargs,
    )


def wait_for(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise AssertionError(f"no server at {url}")


@pytest.fixture
def headless(tmp_path: Path):
    port = free_port()
    env = server_env(tmp_path)
    process = subprocess.Popen(
        [sys.executable, "-m", "kinfer", "--headless", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(url)
        yield url, port, process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(30)


def test_headless_serves_ps_shows_and_sigterm_stops(headless, tmp_path: Path):
    url, port, process = headless
    assert httpx.get(url + "/api/tags", timeout=10).status_code == 200
    assert kinfer("ps", "--port", str(port), home=tmp_path).stdout.strip() == "no model loaded"
    reply = kinfer("run", "smollm2", "What is the capital of France?", "--port", str(port), home=tmp_path)
    assert reply.returncode == 0, reply.stderr
    assert reply.stdout.strip()
    listed = kinfer("ps", "--port", str(port), home=tmp_path)
    assert "smollm2:135m" in listed.stdout
    # the engine's memory account against its budget, and the parts that hold anything
    assert re.search(r" MiB of [\d.]+ GiB ", listed.stdout), listed.stdout
    assert re.search(r"^  weights [\d.]+ MiB  kv [\d.]+ MiB  scratch [\d.]+ MiB$", listed.stdout, re.M)
    memory = httpx.get(url + "/api/ps", timeout=10).json()["models"][0]["memory"]
    assert sum(memory[part] for part in PARTS) == memory["total"] <= memory["budget"]
    metrics = httpx.get(url + "/metrics", timeout=10).text
    for kind in ("weights", "kv", "scratch", "total"):
        assert f'kinfer_engine_memory_bytes{{kind="{kind}",model="smollm2:135m"}}' in metrics
    assert 'kinfer_engine_memory_budget_bytes{model="smollm2:135m"}' in metrics
    # KINFER_THREADS fixes the count: the decode thread tuner stays off
    assert 'kinfer_engine_threads{model="smollm2:135m"} 1.0' in metrics
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 0
    output = process.stdout.read()
    assert f"kinfer listening on http://127.0.0.1:{port}" in output
    assert "default model: smollm2:135m (bundled)" in output
    # one line per request, as Ollama's and llama-server's logs have; a chat with its tokens
    assert re.search(r'kinfer\.requests: 127\.0\.0\.1 "GET /api/tags" 200 ollama \d+ms', output), output
    chat = re.search(
        r'"POST /api/chat" 200 ollama smollm2:135m prompt=(\d+) cached=(\d+) generated=(\d+) (\w+) [\d.]+m?s',
        output,
    )
    assert chat, output
    assert int(chat[1]) > 0 and int(chat[3]) > 0 and chat[4] in ("stop", "length")


def test_run_starts_a_server_when_none_answers(tmp_path: Path):
    port = free_port()
    reply = kinfer("run", "smollm2", "Say hi.", "--port", str(port), home=tmp_path)
    assert reply.returncode == 0, reply.stderr
    assert "starting kinfer" in reply.stderr
    assert reply.stdout.strip()
    with pytest.raises(httpx.HTTPError):  # the server it started for the one-shot is gone again
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)


def test_run_and_ps_fail_clearly(tmp_path: Path):
    port = free_port()
    missing = kinfer("run", "no-such-model", "hi", "--port", str(port), home=tmp_path)
    assert missing.returncode == 1 and "no-such-model" in missing.stderr
    nobody = kinfer("ps", "--port", str(port), home=tmp_path)
    assert nobody.returncode == 1 and "no server answers" in nobody.stderr


def test_the_server_run_starts_keeps_every_access_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from kinfer.commands.serve import ensure_server
    from kinfer.config import Settings

    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-ollama"))
    settings = Settings(
        home=tmp_path,
        port=free_port(),
        api_key="run-s3cret",
        origins="https://app.example.com",
        allowed_hosts="kinfer.lan",
        threads=1,
    )
    process = ensure_server(settings)  # what `kinfer run --api-key ... --origins ...` does first
    assert process is not None
    try:
        url = f"http://127.0.0.1:{settings.port}"
        key = {"Authorization": "Bearer run-s3cret"}
        assert httpx.get(url + "/api/tags", timeout=10).status_code == 401
        assert httpx.get(url + "/api/tags", headers=key, timeout=10).status_code == 200
        page = httpx.get(url + "/api/tags", headers={**key, "Origin": "https://app.example.com"}, timeout=10)
        assert page.headers["access-control-allow-origin"] == "https://app.example.com"
        assert (
            httpx.get(url + "/api/tags", headers={**key, "Host": "kinfer.lan"}, timeout=10).status_code == 200
        )
        assert (
            httpx.get(url + "/api/tags", headers={**key, "Host": "evil.example"}, timeout=10).status_code
            == 403
        )
        # the key travels in the environment: other users of the machine can read a command line
        assert b"run-s3cret" not in Path(f"/proc/{process.pid}/cmdline").read_bytes()
    finally:
        process.terminate()
        process.wait(30)
