"""A request must not be able to make the server allocate without bound.

Ollama's `options.num_ctx` sizes the context when a request loads the model. These tests run
`kinfer --headless` in a subprocess whose address space is capped (RLIMIT_AS), so that an unbounded
allocation fails inside the sandbox instead of taking the machine's memory (without the cap, one
request with num_ctx = 10**9 had the kernel's OOM killer end the server at 22 GB).
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

ADDRESS_SPACE = 6 * 2**30  # plenty for SmolLM2 at its normal size, far below a runaway context


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def capped_server(home: Path) -> Iterator[str]:
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))

    port = free_port()
    env = {**os.environ, "KINFER_HOME": str(home), "OLLAMA_MODELS": str(home / "no-ollama")}
    command = [sys.executable, "-m", "kinfer", "--headless", "--port", str(port), "--parallel", "2"]
    process = subprocess.Popen(
        command, env=env, preexec_fn=cap, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert process.poll() is None, "the server exited while starting"
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        yield url
        assert process.poll() is None, "the server died"
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


def generate(url: str, **options) -> httpx.Response:
    body = {"model": "smollm2", "prompt": "hi", "stream": False, "options": {"num_predict": 2, **options}}
    return httpx.post(url + "/api/generate", json=body, timeout=120)


def test_the_capped_server_serves_a_normal_request(tmp_path: Path):
    with capped_server(tmp_path) as url:
        assert generate(url).status_code == 200
        assert generate(url, num_ctx=1024).status_code == 200


def test_a_huge_num_ctx_on_the_loading_request_is_refused_or_clamped(tmp_path: Path):
    with capped_server(tmp_path) as url:
        reply = generate(url, num_ctx=10**9)
        assert reply.status_code < 500, reply.text
