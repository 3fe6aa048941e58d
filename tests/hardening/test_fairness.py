"""One client's request never hurts another's, through the real server.

- Ollama's `keep_alive: 0` unloads the model once the replies in flight end, never under them.
- One request's `options.num_ctx: 1` never shrinks the context every later request shares.
- --max-queue holds while the model loads: requests beyond it are refused at once, not admitted.
- A model deleted by `kinfer rm` in another process leaves /api/ps and takes no new request.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.conftest import smollm2_path
from tests.hardening.probes import wait_until
from tests.hardening.routes import assert_refused
from tests.live_server import running_server, server_settings
from tests.scripted_engine import ScriptedEngine


def loaded(url: str) -> list[dict]:
    return httpx.get(url + "/api/ps", timeout=10).json()["models"]


def test_keep_alive_zero_from_one_client_never_cuts_another_clients_reply(kinfer_home: Path):
    def factory(model, settings, ctx) -> ScriptedEngine:
        return ScriptedEngine(lambda prompt: "x" * 300, step_delay=0.01)  # ~3 s per reply

    with running_server(server_settings(kinfer_home), engine_factory=factory) as server:
        body = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        lines: list[dict] = []
        started = threading.Event()

        def read() -> None:
            with httpx.stream("POST", server.url + "/api/chat", json=body, timeout=60) as reply:
                for line in reply.iter_lines():
                    if line.strip():
                        lines.append(json.loads(line))
                        started.set()

        reader = threading.Thread(target=read)
        reader.start()
        assert started.wait(30)
        unload = httpx.post(
            server.url + "/api/generate", json={"model": "smollm2", "keep_alive": 0}, timeout=30
        )
        assert unload.status_code == 200 and unload.json()["done_reason"] == "unload"
        assert [m["name"] for m in loaded(server.url)] == ["smollm2:135m"]  # still serving the reply
        reader.join(60)

        assert not any("error" in line for line in lines), lines[-1]
        assert lines[-1]["done"] is True
        assert "".join(line["message"]["content"] for line in lines) == "x" * 300
        wait_until(lambda: loaded(server.url) == [], "the model to unload once the reply ended")


def test_one_requests_tiny_num_ctx_never_shrinks_the_context_for_everybody(kinfer_home: Path):
    with running_server(server_settings(kinfer_home, parallel=1, ctx=1024)) as server:
        tiny = {
            "model": "smollm2",
            "prompt": "Hi",
            "stream": False,
            "options": {"num_ctx": 1, "num_predict": 2},
        }
        assert httpx.post(server.url + "/api/generate", json=tiny, timeout=120).status_code == 200
        assert [m["context_length"] for m in loaded(server.url)] == [1024]

        long_prompt = "Summarise this: " + "the cat sat on the mat. " * 100  # ~700 tokens
        normal = {"model": "smollm2", "prompt": long_prompt, "stream": False, "options": {"num_predict": 2}}
        reply = httpx.post(server.url + "/api/generate", json=normal, timeout=120)
        assert reply.status_code == 200, reply.text


def test_the_queue_bound_holds_while_the_model_loads(kinfer_home: Path):
    def slow_load(model, settings, ctx) -> ScriptedEngine:
        time.sleep(1.0)
        return ScriptedEngine(lambda prompt: "ok")

    with running_server(server_settings(kinfer_home, max_queue=2), engine_factory=slow_load) as server:
        body = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

        def ask(_: int) -> httpx.Response:
            return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)

        with ThreadPoolExecutor(20) as pool:
            replies = list(pool.map(ask, range(20)))
    statuses = sorted(r.status_code for r in replies)
    assert statuses == [200] * 2 + [503] * 18
    for reply in replies:
        if reply.status_code == 503:
            assert_refused("/v1/chat/completions", reply, 503)
            assert int(reply.headers["retry-after"]) >= 1


@pytest.fixture
def linked_model(kinfer_home: Path) -> Path:
    """The bundled SmolLM2 under a second name, models/smolcopy.gguf: a link `kinfer rm` may remove."""
    models = kinfer_home / "models"
    models.mkdir()
    (models / "smolcopy.gguf").symlink_to(smollm2_path())
    return kinfer_home


def test_a_model_removed_by_another_process_leaves_ps_and_takes_no_new_request(linked_model: Path):
    home = linked_model
    with running_server(server_settings(home, parallel=1, ctx=512)) as server:
        ask = {"model": "smolcopy", "prompt": "Hi", "stream": False, "options": {"num_predict": 2}}
        assert httpx.post(server.url + "/api/generate", json=ask, timeout=120).status_code == 200
        assert [m["name"] for m in loaded(server.url)] == ["smolcopy"]

        removed = subprocess.run(  # another process; KINFER_HOME and OLLAMA_MODELS come from kinfer_home
            [sys.executable, "-m", "kinfer", "rm", "smolcopy"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert removed.returncode == 0, removed.stderr

        assert loaded(server.url) == []  # /api/ps notices at once: the idle model is unloaded
        again = httpx.post(server.url + "/api/generate", json=ask, timeout=60)
        assert "smolcopy" in assert_refused("/api/generate", again, 404)
        assert "smolcopy" not in [m["name"] for m in httpx.get(server.url + "/api/tags").json()["models"]]
